//! The contention section's charts: wait-time distributions, grants per
//! client and the crashed-holder hand-off delay, one SVG each, written next
//! to the report and linked from it.

use crate::contention::{ContentionResult, Strategy};
use crate::svg::{Axis, Chart, Mark, Panel, Scale};

fn series(s: Strategy) -> usize {
    Strategy::ALL.iter().position(|&x| x == s).unwrap()
}

fn legend() -> Vec<String> {
    Strategy::ALL
        .iter()
        .map(|s| s.label().to_string())
        .collect()
}

/// A log range of whole decades around `lo..hi` (in ms), at least `floor`.
fn decades(lo: f64, hi: f64, floor: f64) -> Scale {
    let a = 10f64.powf(lo.max(floor).log10().floor());
    let b = 10f64.powf(hi.max(a * 10.0).log10().ceil());
    Scale::Log(a, b)
}

/// Points of the empirical CDF of sorted `v` (µs) as (ms, fraction): evenly
/// spaced ranks plus ranks ever closer to the top, so the tail is drawn.
fn cdf(v: &[u64]) -> Vec<(f64, f64)> {
    let n = v.len();
    if n == 0 {
        return vec![];
    }
    let mut idx: Vec<usize> = (0..=500).map(|j| j * (n - 1) / 500).collect();
    for t in 0..=80 {
        let above = (n as f64 * 10f64.powf(-t as f64 / 20.0)) as usize;
        idx.push(n.saturating_sub(above.max(1)));
    }
    idx.sort_unstable();
    idx.dedup();
    let mut pts = vec![(v[0] as f64 / 1000.0, 0.0)];
    pts.extend(
        idx.iter()
            .map(|&i| (v[i] as f64 / 1000.0, (i + 1) as f64 / n as f64)),
    );
    pts
}

/// The wait-time CDF, one panel per hold time.
pub fn waits(runs: &[(u64, Vec<ContentionResult>)], clients: usize, seconds: f64) -> String {
    let all = runs.iter().flat_map(|(_, rs)| rs.iter());
    let lo = all
        .clone()
        .filter_map(|r| r.waits.first())
        .min()
        .copied()
        .unwrap_or(10) as f64
        / 1000.0;
    let hi = all
        .filter_map(|r| r.waits.last())
        .max()
        .copied()
        .unwrap_or(1) as f64
        / 1000.0;
    let xs = decades(lo, hi, 0.001);
    let panels = runs
        .iter()
        .map(|(hold, rs)| {
            let mut marks = vec![
                Mark::HRule {
                    y: 0.5,
                    label: "p50".into(),
                },
                Mark::HRule {
                    y: 0.99,
                    label: "p99".into(),
                },
            ];
            marks.extend(rs.iter().map(|r| Mark::Line {
                series: series(r.strategy),
                points: cdf(&r.waits),
            }));
            Panel {
                title: format!("hold {hold} ms"),
                x: Axis::new("wait from first try to grant (ms, log scale)", xs),
                y: Axis::new(
                    "fraction of grants that waited at most x",
                    Scale::Linear(0.0, 1.0),
                ),
                marks,
            }
        })
        .collect();
    Chart {
        title: format!("Wait for the lock: {clients} clients, one key"),
        subtitle: format!(
            "Cumulative distribution of every grant's wait, {seconds:.1} s per strategy; \
             further left is shorter, a steeper curve is more even."
        ),
        legend: legend(),
        panels,
        left: 64.0,
        panel_width: 420.0,
        panel_height: 300.0,
    }
    .render()
}

/// Grants per client, ranked, over the mean: 1 everywhere is a fair share.
pub fn fairness(runs: &[(u64, Vec<ContentionResult>)], clients: usize, seconds: f64) -> String {
    let ratio = |r: &ContentionResult| {
        let mean = r.grants as f64 / r.per_client.len().max(1) as f64;
        let mut v: Vec<f64> = r
            .per_client
            .iter()
            .map(|&g| g as f64 / mean.max(1e-9))
            .collect();
        v.sort_by(|a, b| b.total_cmp(a));
        v
    };
    let top = runs
        .iter()
        .flat_map(|(_, rs)| rs.iter())
        .flat_map(|r| ratio(r).first().copied())
        .fold(1.0f64, f64::max);
    let ys = Scale::Linear(0.0, (top * 2.0).ceil() / 2.0 + 0.25);
    let panels = runs
        .iter()
        .map(|(hold, rs)| {
            let mut marks = vec![Mark::HRule {
                y: 1.0,
                label: "equal share".into(),
            }];
            marks.extend(rs.iter().map(|r| {
                Mark::Line {
                    series: series(r.strategy),
                    points: ratio(r)
                        .into_iter()
                        .enumerate()
                        .map(|(i, y)| ((i + 1) as f64, y))
                        .collect(),
                }
            }));
            Panel {
                title: format!("hold {hold} ms"),
                x: Axis::new(
                    "clients, most grants first (rank)",
                    Scale::Linear(1.0, clients.max(2) as f64),
                ),
                y: Axis::new("grants of the client ÷ mean per client", ys),
                marks,
            }
        })
        .collect();
    Chart {
        title: format!("Grants per client: {clients} clients, one key"),
        subtitle: format!(
            "Each client's share of the grants in {seconds:.1} s, clients ranked; \
             a flat line at 1 is a fair lock, a slope is starvation of some."
        ),
        legend: legend(),
        panels,
        left: 64.0,
        panel_width: 420.0,
        panel_height: 300.0,
    }
    .render()
}

/// Every trial's delay from the crashed holder's lease deadline to the next
/// grant, one row per strategy, with its p50 and p99 marked.
pub fn handoff(delays: &[(Strategy, Vec<u64>)], lease_ms: u64, waiters: usize) -> String {
    let rows = delays.len();
    let lo = delays
        .iter()
        .flat_map(|(_, d)| d.iter())
        .min()
        .copied()
        .unwrap_or(100) as f64
        / 1000.0;
    let hi = delays
        .iter()
        .flat_map(|(_, d)| d.iter())
        .max()
        .copied()
        .unwrap_or(1000) as f64
        / 1000.0;
    let xs = decades(lo, hi, 0.01);
    let Scale::Log(floor, _) = xs else {
        unreachable!()
    };
    let clamped = if lo < floor {
        format!("\nDelays under {} ms (0 when the grant came within the clock's rounding of the deadline) sit at the left edge.", crate::svg::number(floor))
    } else {
        String::new()
    };
    let row_y = |k: usize| (rows - 1 - k) as f64;
    let mut marks = vec![];
    for (k, (s, d)) in delays.iter().enumerate() {
        let y = row_y(k);
        let points = d
            .iter()
            .enumerate()
            .map(|(i, &us)| {
                // A fixed spread over the row, so piled dots show as a band.
                let jitter = ((i * 37) % 23) as f64 / 22.0 - 0.5;
                (us as f64 / 1000.0, y + jitter * 0.3)
            })
            .collect();
        marks.push(Mark::Dots {
            series: series(*s),
            points,
        });
        let mut sorted = d.clone();
        for (q, below) in [(50.0, false), (99.0, true)] {
            let v = crate::stats::percentile(&mut sorted, q) as f64 / 1000.0;
            marks.push(Mark::Tick {
                series: series(*s),
                x: v,
                y,
                h: 0.22,
                label: format!("p{q:.0} {v:.2} ms"),
                below,
            });
        }
    }
    let mut y = Axis::new("", Scale::Linear(-0.6, rows as f64 - 0.4));
    y.ticks = delays
        .iter()
        .enumerate()
        .map(|(k, (s, _))| (row_y(k), s.label().to_string()))
        .collect();
    Chart {
        title: format!("Hand-off after a crashed holder: {waiters} waiters"),
        subtitle: format!(
            "Delay from the end of its {lease_ms} ms lease to the next grant; a dot per trial \
             ({} trials), bars at p50 (label above) and p99 (below).{clamped}",
            delays.first().map_or(0, |(_, d)| d.len())
        ),
        legend: vec![],
        panels: vec![Panel {
            title: String::new(),
            x: Axis::new(
                "delay from lease deadline to next grant (ms, log scale)",
                xs,
            ),
            y,
            marks,
        }],
        left: 200.0,
        panel_width: 640.0,
        panel_height: 280.0,
    }
    .render()
}
