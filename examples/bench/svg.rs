//! Charts for the report, as SVG built from strings: panels side by side,
//! each with its own axes (linear or log), lines, dots and ticks, under one
//! title and one legend. Enough for the contention and hand-off charts;
//! nothing here is general plotting.

use std::fmt::Write as _;

/// Colours (Okabe–Ito, told apart with common colour blindness) and dash
/// patterns, one per series.
pub const COLORS: [&str; 4] = ["#D55E00", "#E69F00", "#CC79A7", "#0072B2"];
pub const DASHES: [&str; 4] = ["6 3", "2 3", "8 3 2 3", ""];

#[derive(Clone, Copy)]
pub enum Scale {
    Linear(f64, f64),
    Log(f64, f64),
}

impl Scale {
    /// Where `v` falls, 0..1 from the low end (clamped to the range).
    fn frac(self, v: f64) -> f64 {
        let f = match self {
            Scale::Linear(a, b) => (v - a) / (b - a),
            Scale::Log(a, b) => (v.max(a).ln() - a.ln()) / (b.ln() - a.ln()),
        };
        f.clamp(0.0, 1.0)
    }

    /// Ticks: every decade of a log scale, `n` steps of a round size on a
    /// linear one.
    pub fn ticks(self, n: usize) -> Vec<(f64, String)> {
        match self {
            Scale::Log(a, b) => {
                let mut t = vec![];
                let mut e = a.log10().ceil() as i32;
                while 10f64.powi(e) <= b * 1.000_001 {
                    let v = 10f64.powi(e);
                    t.push((v, number(v)));
                    e += 1;
                }
                t
            }
            Scale::Linear(a, b) => {
                let raw = (b - a) / n.max(1) as f64;
                let mag = 10f64.powf(raw.log10().floor());
                let step = [1.0, 2.0, 2.5, 5.0, 10.0]
                    .iter()
                    .map(|m| m * mag)
                    .find(|s| *s >= raw)
                    .unwrap_or(10.0 * mag);
                let mut t = vec![];
                let mut v = (a / step).ceil() * step;
                while v <= b + step * 1e-6 {
                    t.push((v, number(v)));
                    v += step;
                }
                t
            }
        }
    }
}

/// A tick label: no trailing zeros, no exponent.
pub fn number(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let digits = (2 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

pub struct Axis {
    pub label: String,
    pub scale: Scale,
    pub ticks: Vec<(f64, String)>,
}

impl Axis {
    /// An axis with its scale's own ticks.
    pub fn new(label: &str, scale: Scale) -> Axis {
        Axis {
            label: label.into(),
            scale,
            ticks: scale.ticks(5),
        }
    }
}

pub enum Mark {
    /// A polyline through data points, in series `series`'s colour and dash.
    Line {
        series: usize,
        points: Vec<(f64, f64)>,
    },
    /// Round dots, see-through so that piles show as darker.
    Dots {
        series: usize,
        points: Vec<(f64, f64)>,
    },
    /// A vertical tick at (x, y) of half-height `h` in data units of y,
    /// labelled above it, or below it if `below`.
    Tick {
        series: usize,
        x: f64,
        y: f64,
        h: f64,
        label: String,
        below: bool,
    },
    /// A grey dashed reference line across the panel at y, labelled under
    /// its right end.
    HRule { y: f64, label: String },
}

pub struct Panel {
    pub title: String,
    pub x: Axis,
    pub y: Axis,
    pub marks: Vec<Mark>,
}

pub struct Chart {
    pub title: String,
    /// One line, or two if there is no legend.
    pub subtitle: String,
    /// Series names, in series order, for the legend.
    pub legend: Vec<String>,
    pub panels: Vec<Panel>,
    /// Room left of each panel for the y tick labels and axis label.
    pub left: f64,
    pub panel_width: f64,
    pub panel_height: f64,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

impl Chart {
    pub fn render(&self) -> String {
        let (right, gap) = (20.0, 30.0);
        let top = 84.0; // title, subtitle, legend
        let bottom = 56.0; // x ticks and label
        let width = self.panels.len() as f64 * (self.left + self.panel_width + gap) - gap + right;
        let height = top + 24.0 + self.panel_height + bottom;
        let mut s = String::new();
        writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
        )
        .unwrap();
        writeln!(
            s,
            r#"<rect width="100%" height="100%" fill="white"/>
<text x="12" y="22" font-size="16" font-weight="bold">{}</text>"#,
            esc(&self.title),
        )
        .unwrap();
        // Subtitle lines; a second line only where there is no legend.
        for (i, line) in self.subtitle.lines().enumerate() {
            writeln!(
                s,
                r##"<text x="12" y="{}" fill="#444">{}</text>"##,
                40 + 16 * i,
                esc(line)
            )
            .unwrap();
        }
        // Legend: one row, a line sample and the name per series.
        let mut lx = 12.0;
        for (i, name) in self.legend.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            let d = DASHES[i % DASHES.len()];
            writeln!(
                s,
                r#"<line x1="{lx}" y1="62" x2="{:.0}" y2="62" stroke="{c}" stroke-width="2.5" stroke-dasharray="{d}"/><circle cx="{:.0}" cy="62" r="3.5" fill="{c}"/><text x="{:.0}" y="66">{}</text>"#,
                lx + 28.0,
                lx + 14.0,
                lx + 34.0,
                esc(name)
            )
            .unwrap();
            lx += 34.0 + 6.6 * name.chars().count() as f64 + 22.0;
        }
        for (k, p) in self.panels.iter().enumerate() {
            let x0 = k as f64 * (self.left + self.panel_width + gap) + self.left;
            let y0 = top + 24.0;
            self.panel(&mut s, p, x0, y0);
        }
        s.push_str("</svg>\n");
        s
    }

    fn panel(&self, s: &mut String, p: &Panel, x0: f64, y0: f64) {
        let (w, h) = (self.panel_width, self.panel_height);
        let px = |v: f64| x0 + p.x.scale.frac(v) * w;
        let py = |v: f64| y0 + h - p.y.scale.frac(v) * h;
        writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-weight="bold">{}</text>"#,
            x0 + w / 2.0,
            y0 - 8.0,
            esc(&p.title)
        )
        .unwrap();
        // Grid and ticks.
        for (v, label) in &p.x.ticks {
            let x = px(*v);
            writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{y0:.1}" x2="{x:.1}" y2="{:.1}" stroke="#e4e4e4"/><line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#333"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                y0 + h,
                y0 + h,
                y0 + h + 5.0,
                y0 + h + 18.0,
                esc(label)
            )
            .unwrap();
        }
        for (v, label) in &p.y.ticks {
            let y = py(*v);
            writeln!(
                s,
                r##"<line x1="{x0:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e4e4e4"/><line x1="{:.1}" y1="{y:.1}" x2="{x0:.1}" y2="{y:.1}" stroke="#333"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                x0 + w,
                x0 - 5.0,
                x0 - 8.0,
                y + 4.0,
                esc(label)
            )
            .unwrap();
        }
        writeln!(
            s,
            r##"<rect x="{x0:.1}" y="{y0:.1}" width="{w:.1}" height="{h:.1}" fill="none" stroke="#333"/>"##
        )
        .unwrap();
        writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            x0 + w / 2.0,
            y0 + h + 40.0,
            esc(&p.x.label)
        )
        .unwrap();
        if !p.y.label.is_empty() {
            let (lx, ly) = (x0 - self.left + 16.0, y0 + h / 2.0);
            writeln!(
                s,
                r#"<text x="{lx:.1}" y="{ly:.1}" text-anchor="middle" transform="rotate(-90 {lx:.1} {ly:.1})">{}</text>"#,
                esc(&p.y.label)
            )
            .unwrap();
        }
        for m in &p.marks {
            match m {
                Mark::HRule { y, label } => {
                    let y = py(*y);
                    writeln!(
                        s,
                        r##"<line x1="{x0:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#888" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#666" font-size="11">{}</text>"##,
                        x0 + w,
                        x0 + w - 4.0,
                        y + 13.0,
                        esc(label)
                    )
                    .unwrap();
                }
                Mark::Line { series, points } => {
                    let pts: Vec<String> = points
                        .iter()
                        .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                        .collect();
                    writeln!(
                        s,
                        r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2" stroke-dasharray="{}" stroke-linejoin="round"/>"#,
                        pts.join(" "),
                        COLORS[series % COLORS.len()],
                        DASHES[series % DASHES.len()]
                    )
                    .unwrap();
                }
                Mark::Dots { series, points } => {
                    let c = COLORS[series % COLORS.len()];
                    for &(x, y) in points {
                        writeln!(
                            s,
                            r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}" fill-opacity="0.35"/>"#,
                            px(x),
                            py(y)
                        )
                        .unwrap();
                    }
                }
                Mark::Tick {
                    series,
                    x,
                    y,
                    h,
                    label,
                    below,
                } => {
                    let (x, ya, yb) = (px(*x), py(y - h), py(y + h));
                    let ty = if *below { ya + 11.0 } else { yb - 3.0 };
                    writeln!(
                        s,
                        r##"<line x1="{x:.1}" y1="{ya:.1}" x2="{x:.1}" y2="{yb:.1}" stroke="{}" stroke-width="2.5"/><text x="{x:.1}" y="{:.1}" text-anchor="middle" font-size="10" fill="#222">{}</text>"##,
                        COLORS[series % COLORS.len()],
                        ty,
                        esc(label)
                    )
                    .unwrap();
                }
            }
        }
    }
}
