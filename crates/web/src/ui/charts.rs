//! Server-side SVG charts with axes, units and legends. Colours are the page's CSS variables,
//! so one chart reads well in the light and the dark theme, and in a screenshot. Missing
//! values are gaps (unknown), never drawn as 0.

use std::fmt::Write;

const W: f64 = 960.0;
const H: f64 = 260.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 14.0;
const BOTTOM: f64 = 44.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One line or one stack of a chart.
pub struct Series {
    pub name: String,
    /// A CSS colour, usually a variable such as `var(--busy)`.
    pub color: String,
    pub values: Vec<Option<f64>>,
}

fn frame(out: &mut String, label: &str, y_max: f64, y_unit: &str, x_labels: &[String]) {
    let _ = write!(
        out,
        r#"<svg class="chart" role="img" aria-label="{}" viewBox="0 0 {W} {H}" preserveAspectRatio="xMidYMid meet">"#,
        esc(label)
    );
    let plot_h = H - TOP - BOTTOM;
    for i in 0..=4 {
        let v = y_max * i as f64 / 4.0;
        let y = TOP + plot_h - plot_h * i as f64 / 4.0;
        let _ = write!(
            out,
            r#"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="var(--line)" stroke-width="1"/><text x="{}" y="{:.1}" text-anchor="end" class="tick">{}{}</text>"#,
            W - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            fmt_tick(v),
            y_unit
        );
    }
    let n = x_labels.len().max(1);
    let step = (n as f64 / 10.0).ceil().max(1.0) as usize;
    let slot = (W - LEFT - RIGHT) / n as f64;
    for (i, l) in x_labels.iter().enumerate() {
        if i % step == 0 {
            let x = LEFT + slot * (i as f64 + 0.5);
            let _ = write!(
                out,
                r#"<text x="{x:.1}" y="{}" text-anchor="middle" class="tick">{}</text>"#,
                H - BOTTOM + 16.0,
                esc(l)
            );
        }
    }
    let _ = write!(
        out,
        r#"<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{}" stroke="var(--muted)"/>"#,
        TOP + plot_h
    );
}

fn fmt_tick(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn legend(out: &mut String, series: &[Series]) {
    let mut x = LEFT;
    for s in series {
        let _ = write!(
            out,
            r#"<rect x="{x:.1}" y="{}" width="12" height="12" fill="{}" rx="2"/><text x="{:.1}" y="{}" class="legend">{}</text>"#,
            H - 18.0,
            s.color,
            x + 16.0,
            H - 8.0,
            esc(&s.name)
        );
        x += 24.0 + 7.5 * s.name.chars().count() as f64;
    }
}

/// A line chart; gaps where a value is unknown.
pub fn lines(
    label: &str,
    x_labels: &[String],
    series: &[Series],
    y_max: f64,
    y_unit: &str,
) -> String {
    let mut out = String::new();
    let y_max = if y_max > 0.0 { y_max } else { 1.0 };
    frame(&mut out, label, y_max, y_unit, x_labels);
    let n = x_labels.len().max(1);
    let slot = (W - LEFT - RIGHT) / n as f64;
    let plot_h = H - TOP - BOTTOM;
    for s in series {
        let mut path = String::new();
        let mut pen_up = true;
        for (i, v) in s.values.iter().enumerate() {
            match v {
                Some(v) => {
                    let x = LEFT + slot * (i as f64 + 0.5);
                    let y = TOP + plot_h - plot_h * (v / y_max).clamp(0.0, 1.0);
                    let _ = write!(path, "{}{x:.1},{y:.1} ", if pen_up { "M" } else { "L" });
                    pen_up = false;
                }
                None => pen_up = true,
            }
        }
        let _ = write!(
            out,
            r#"<path d="{path}" fill="none" stroke="{}" stroke-width="2.2"/>"#,
            s.color
        );
        if s.values.iter().filter(|v| v.is_some()).count() == 1 {
            if let Some((i, Some(v))) = s.values.iter().enumerate().find(|(_, v)| v.is_some()) {
                let x = LEFT + slot * (i as f64 + 0.5);
                let y = TOP + plot_h - plot_h * (v / y_max).clamp(0.0, 1.0);
                let _ = write!(
                    out,
                    r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{}"/>"#,
                    s.color
                );
            }
        }
    }
    legend(&mut out, series);
    out.push_str("</svg>");
    out
}

/// Stacked bars, one bar per x label, stacks in series order from the bottom.
pub fn stacked(label: &str, x_labels: &[String], series: &[Series], y_unit: &str) -> String {
    let n = x_labels.len();
    let totals: Vec<f64> = (0..n)
        .map(|i| {
            series
                .iter()
                .map(|s| s.values.get(i).copied().flatten().unwrap_or(0.0))
                .sum()
        })
        .collect();
    let y_max = totals.iter().copied().fold(0.0, f64::max).max(1.0);
    let mut out = String::new();
    frame(&mut out, label, y_max, y_unit, x_labels);
    let slot = (W - LEFT - RIGHT) / n.max(1) as f64;
    let plot_h = H - TOP - BOTTOM;
    for (i, xl) in x_labels.iter().enumerate() {
        let mut base = 0.0;
        for s in series {
            let v = s.values.get(i).copied().flatten().unwrap_or(0.0);
            if v <= 0.0 {
                continue;
            }
            let h = plot_h * v / y_max;
            let y = TOP + plot_h - plot_h * base / y_max - h;
            let _ = write!(
                out,
                r#"<rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{h:.1}" fill="{}"><title>{}: {} {}{}</title></rect>"#,
                LEFT + slot * i as f64 + slot * 0.12,
                slot * 0.76,
                s.color,
                esc(xl),
                esc(&s.name),
                fmt_tick(v),
                y_unit
            );
            base += v;
        }
    }
    legend(&mut out, series);
    out.push_str("</svg>");
    out
}

/// A day's projection: low, expected, high.
pub type Band = (f64, f64, f64);

/// What was spent per day as bars, and for the days a forecast covers its expected value as a
/// dashed line over its range (shaded), labelled as a forecast. Days without a figure are gaps.
pub fn forecast_bars(
    label: &str,
    x_labels: &[String],
    actual: &[Option<f64>],
    forecast: &[Option<Band>],
    y_unit: &str,
) -> String {
    let n = x_labels.len();
    let y_max = actual
        .iter()
        .flatten()
        .copied()
        .chain(forecast.iter().flatten().map(|b| b.2))
        .fold(0.0, f64::max)
        .max(1.0);
    let mut out = String::new();
    frame(&mut out, label, y_max, y_unit, x_labels);
    let slot = (W - LEFT - RIGHT) / n.max(1) as f64;
    let plot_h = H - TOP - BOTTOM;
    let y_of = |v: f64| TOP + plot_h - plot_h * (v / y_max).clamp(0.0, 1.0);
    let x_of = |i: usize| LEFT + slot * (i as f64 + 0.5);
    for (i, (xl, v)) in x_labels.iter().zip(actual).enumerate() {
        let Some(v) = v else { continue };
        let y = y_of(*v);
        let _ = write!(
            out,
            r#"<rect class="spent" x="{:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="var(--busy)"><title>{}: spent {}{}</title></rect>"#,
            LEFT + slot * i as f64 + slot * 0.12,
            slot * 0.76,
            TOP + plot_h - y,
            esc(xl),
            fmt_tick(*v),
            y_unit
        );
    }
    let days: Vec<(usize, Band)> = forecast
        .iter()
        .enumerate()
        .filter_map(|(i, b)| Some((i, (*b)?)))
        .collect();
    if !days.is_empty() {
        let mut band = String::new();
        for (i, b) in &days {
            let _ = write!(band, "{:.1},{:.1} ", x_of(*i), y_of(b.2));
        }
        for (i, b) in days.iter().rev() {
            let _ = write!(band, "{:.1},{:.1} ", x_of(*i), y_of(b.0));
        }
        let _ = write!(
            out,
            r#"<polygon class="forecast-band" points="{}" fill="var(--idle)" fill-opacity="0.25" stroke="none"/>"#,
            band.trim_end()
        );
        let mut line = String::new();
        for (k, (i, b)) in days.iter().enumerate() {
            let _ = write!(
                line,
                "{}{:.1},{:.1} ",
                if k == 0 { "M" } else { "L" },
                x_of(*i),
                y_of(b.1)
            );
        }
        let _ = write!(
            out,
            r#"<path class="forecast-line" d="{}" fill="none" stroke="var(--idle)" stroke-width="2.2" stroke-dasharray="6 4"/>"#,
            line.trim_end()
        );
        for (i, b) in &days {
            let _ = write!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="var(--idle)"><title>{}: forecast {} ({} to {}){}</title></circle>"#,
                x_of(*i),
                y_of(b.1),
                esc(&x_labels[*i]),
                fmt_tick(b.1),
                fmt_tick(b.0),
                fmt_tick(b.2),
                y_unit
            );
        }
    }
    legend(
        &mut out,
        &[
            Series {
                name: "spent".into(),
                color: "var(--busy)".into(),
                values: vec![],
            },
            Series {
                name: "forecast (dashed: expected; shaded: range)".into(),
                color: "var(--idle)".into(),
                values: vec![],
            },
        ],
    );
    out.push_str("</svg>");
    out
}

/// Mean activity by weekday × hour of day; cells without data are hatched as unknown.
pub fn heatmap(label: &str, cells: &[Vec<Option<f64>>]) -> String {
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    let cw = (W - LEFT - RIGHT) / 24.0;
    let ch = 26.0;
    let height = TOP + ch * 7.0 + 56.0;
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg class="chart" role="img" aria-label="{}" viewBox="0 0 {W} {height}" preserveAspectRatio="xMidYMid meet"><defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="var(--card)"/><line x1="0" y1="0" x2="0" y2="6" stroke="var(--unknown)" stroke-width="2"/></pattern></defs>"#,
        esc(label)
    );
    for (d, row) in cells.iter().enumerate().take(7) {
        let y = TOP + ch * d as f64;
        let _ = write!(
            out,
            r#"<text x="{}" y="{:.1}" text-anchor="end" class="tick">{}</text>"#,
            LEFT - 6.0,
            y + ch * 0.65,
            DAYS[d]
        );
        for (h, v) in row.iter().enumerate().take(24) {
            let x = LEFT + cw * h as f64;
            match v {
                Some(v) => {
                    let _ = write!(
                        out,
                        r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="var(--busy)" fill-opacity="{:.2}"><title>{} {h:02}:00 UTC: {v:.1} % mean activity</title></rect>"#,
                        cw - 2.0,
                        ch - 2.0,
                        0.08 + 0.92 * (v / 100.0).clamp(0.0, 1.0),
                        DAYS[d]
                    );
                }
                None => {
                    let _ = write!(
                        out,
                        r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="url(#hatch)"><title>{} {h:02}:00 UTC: unknown</title></rect>"#,
                        cw - 2.0,
                        ch - 2.0,
                        DAYS[d]
                    );
                }
            }
        }
    }
    for h in (0..24).step_by(3) {
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" class="tick">{h:02}:00</text>"#,
            LEFT + cw * (h as f64 + 0.5),
            TOP + ch * 7.0 + 14.0
        );
    }
    let ly = TOP + ch * 7.0 + 30.0;
    for (i, v) in [0.0, 25.0, 50.0, 75.0, 100.0].iter().enumerate() {
        let x = LEFT + i as f64 * 70.0;
        let _ = write!(
            out,
            r#"<rect x="{x:.1}" y="{ly:.1}" width="14" height="14" fill="var(--busy)" fill-opacity="{:.2}"/><text x="{:.1}" y="{:.1}" class="legend">{v:.0} %</text>"#,
            0.08 + 0.92 * v / 100.0,
            x + 18.0,
            ly + 12.0
        );
    }
    let _ = write!(
        out,
        r#"<rect x="{:.1}" y="{ly:.1}" width="14" height="14" fill="url(#hatch)"/><text x="{:.1}" y="{:.1}" class="legend">unknown</text>"#,
        LEFT + 360.0,
        LEFT + 378.0,
        ly + 12.0
    );
    out.push_str("</svg>");
    out
}

/// Intervals on a time axis, one row each: who held a GPU when. `end` is the window's end for
/// intervals still running.
pub fn timeline(label: &str, from: i64, to: i64, rows: &[(String, i64, i64, bool)]) -> String {
    let row_h = 22.0;
    let height = TOP + row_h * rows.len().max(1) as f64 + 40.0;
    let left = 240.0;
    let span = (to - from).max(1) as f64;
    let x_of = |t: i64| left + (W - left - RIGHT) * ((t - from) as f64 / span).clamp(0.0, 1.0);
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg class="chart" role="img" aria-label="{}" viewBox="0 0 {W} {height}" preserveAspectRatio="xMidYMid meet">"#,
        esc(label)
    );
    for (i, (name, s, e, open)) in rows.iter().enumerate() {
        let y = TOP + row_h * i as f64;
        let short: String = name.chars().take(34).collect();
        let _ = write!(
            out,
            r#"<text x="{}" y="{:.1}" text-anchor="end" class="tick">{}</text>"#,
            left - 6.0,
            y + row_h * 0.65,
            esc(&short)
        );
        let (x1, x2) = (x_of(*s), x_of(*e));
        let _ = write!(
            out,
            r#"<rect x="{x1:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="var(--alloc)" rx="2"><title>{}{}</title></rect>"#,
            y + 3.0,
            (x2 - x1).max(2.0),
            row_h - 6.0,
            esc(name),
            if *open { " (running)" } else { "" }
        );
    }
    let axis_y = TOP + row_h * rows.len().max(1) as f64 + 4.0;
    for i in 0..=4 {
        let t = from + (span as i64) * i / 4;
        let x = x_of(t);
        let label = chrono::DateTime::from_timestamp(t, 0)
            .map(|d| d.format("%m-%d %H:%M").to_string())
            .unwrap_or_default();
        let _ = write!(
            out,
            r#"<line x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{axis_y:.1}" stroke="var(--line)"/><text x="{x:.1}" y="{:.1}" text-anchor="middle" class="tick">{label}</text>"#,
            axis_y + 16.0
        );
    }
    if rows.is_empty() {
        let _ = write!(
            out,
            r#"<text x="{left}" y="{}" class="legend">no allocation in this range</text>"#,
            TOP + 15.0
        );
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_values_break_the_line_instead_of_dropping_to_zero() {
        let svg = lines(
            "t",
            &["a".into(), "b".into(), "c".into()],
            &[Series {
                name: "x".into(),
                color: "red".into(),
                values: vec![Some(10.0), None, Some(20.0)],
            }],
            100.0,
            " %",
        );
        let d = svg.split(r#"<path d=""#).nth(1).unwrap();
        assert_eq!(d.matches('M').count(), 2, "{d}");
        assert!(svg.contains("100 %"));
    }

    #[test]
    fn forecast_bars_draw_spend_and_a_labelled_band_only_where_known() {
        let labels: Vec<String> = ["1", "2", "3", "4"].map(String::from).to_vec();
        let svg = forecast_bars(
            "spend",
            &labels,
            &[Some(10.0), Some(4.0), None, None],
            &[None, Some((8.0, 10.0, 12.0)), Some((9.0, 10.0, 11.0)), None],
            " $",
        );
        assert_eq!(svg.matches(r#"class="spent""#).count(), 2);
        assert!(svg.contains("2: forecast 10 (8 to 12) $"), "{svg}");
        assert!(svg.contains("forecast (dashed: expected; shaded: range)"));
        let line = svg.split(r#"class="forecast-line" d=""#).nth(1).unwrap();
        assert_eq!(line.split('"').next().unwrap().matches('L').count(), 1);
        // No forecast at all: no band is drawn.
        let none = forecast_bars("s", &labels, &[Some(1.0); 4], &[None; 4], " $");
        assert!(!none.contains("forecast-band"));
    }

    #[test]
    fn heatmap_hatches_unknown_cells() {
        let mut cells = vec![vec![None; 24]; 7];
        cells[0][9] = Some(80.0);
        let svg = heatmap("h", &cells);
        assert!(svg.contains("Mon 09:00 UTC: 80.0 % mean activity"));
        assert!(svg.contains("Sun 23:00 UTC: unknown"));
    }
}
