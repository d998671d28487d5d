//! Percentiles and medians.

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
