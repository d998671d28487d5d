//! Percentiles and medians, and the cells the contended-lock tables
//! (sections 7 and 8) share.

#[derive(Clone, Copy, Debug, Default)]
pub struct Summary {
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

impl Summary {
    pub fn of(values: &mut [u64]) -> Summary {
        Summary {
            p50: percentile(values, 50.0),
            p99: percentile(values, 99.0),
            max: values.iter().copied().max().unwrap_or(0),
        }
    }

    /// "p50 | p99 | max", in milliseconds: three table cells.
    pub fn cells(&self) -> String {
        format!("{} | {} | {}", ms(self.p50), ms(self.p99), ms(self.max))
    }
}

/// The fewest grants of any client, and the fairness cell: the most grants
/// of any client divided by the fewest.
pub fn fairness(per_client: &[u64]) -> (u64, String) {
    let min = per_client.iter().copied().min().unwrap_or(0);
    let max = per_client.iter().copied().max().unwrap_or(0);
    let cell = match min {
        0 => "∞ (a client starved)".to_string(),
        m => format!("{:.2}", max as f64 / m as f64),
    };
    (min, cell)
}

/// Nearest-rank percentile (sorts `values`).
pub fn percentile(values: &mut [u64], q: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    let rank = ((q / 100.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

/// Microseconds as milliseconds with 2 decimals.
pub fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
