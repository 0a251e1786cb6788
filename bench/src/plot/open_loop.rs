//! The open-loop picture: latency (p50 and p99, from the scheduled arrival) against offered
//! load, per library, one panel for uniform keys and one for Zipf keys, on a log scale; a point
//! whose requests timed out is marked with their count.

use super::{colour, duration_label, escape, frame, subtitle, FONT};
use crate::run::OPEN_LOOP;
use crate::workloads::open_loop::Keys;
use serde_json::Value;
use std::fmt::Write as _;

const LEFT: f64 = 80.0;
const PLOT_WIDTH: f64 = 560.0;
const PANEL_HEIGHT: f64 = 220.0;
/// The quantiles drawn: key in the JSON, label, dash pattern.
const LINES: [(&str, &str, &str); 2] = [("p50_us", "p50", ""), ("p99_us", "p99", "6 4")];

/// One line of a panel: quantile label, library, its points in the order of offered load.
type Series<'a> = (String, &'a str, Vec<Point>);

/// One measured point: offered load in %, latency in µs, timeouts.
struct Point {
    percent: u32,
    us: f64,
    timeouts: f64,
}

/// The picture, or a frame saying the run had no open-loop section.
pub(crate) fn draw(json: &Value) -> String {
    let title = "Open loop: latency from the scheduled arrival against offered load \
                 (log scale; lower is better)";
    let panels: Vec<(Keys, Vec<Series>)> = [Keys::Uniform, Keys::Zipf]
        .into_iter()
        .map(|keys| (keys, series(json, keys)))
        .filter(|(_, series)| !series.is_empty())
        .collect();
    if panels.is_empty() {
        return frame(title, &subtitle(json), 80.0, "");
    }
    let scale = Scale::new(&panels);
    let mut body = String::new();
    let mut top = 56.0;
    for (keys, series) in &panels {
        grid(&mut body, *keys, &scale, top);
        let mut legend = top + 30.0;
        for line in series {
            draw_line(&mut body, line, &scale, top, legend);
            legend += 16.0;
        }
        top += 20.0 + PANEL_HEIGHT + 16.0 + 24.0;
    }
    frame(title, &subtitle(json), top - 10.0, &body)
}

/// Where a point goes: offered loads spread evenly across, latencies by decade upwards.
struct Scale {
    decade_low: f64,
    decade_high: f64,
    percents: Vec<u32>,
}

impl Scale {
    fn new(panels: &[(Keys, Vec<Series>)]) -> Scale {
        let values = panels
            .iter()
            .flat_map(|(_, series)| series.iter().flat_map(|(_, _, points)| points))
            .map(|point| point.us.max(1.0));
        let (low, high) = values.fold((f64::MAX, 0.0_f64), |(low, high), us| {
            (low.min(us), high.max(us))
        });
        Scale {
            decade_low: low.log10().floor(),
            decade_high: high.log10().ceil().max(low.log10().floor() + 1.0),
            percents: OPEN_LOOP
                .iter()
                .filter(|(keys, _, _)| *keys == Keys::Uniform)
                .map(|(_, percent, _)| *percent)
                .collect(),
        }
    }

    fn x(&self, percent: u32) -> f64 {
        let index = self
            .percents
            .iter()
            .position(|p| *p == percent)
            .unwrap_or(0) as f64;
        LEFT + 30.0 + index * (PLOT_WIDTH - 60.0) / (self.percents.len().max(2) - 1) as f64
    }

    /// The height of `us` in the panel whose top is `top`.
    fn y(&self, top: f64, us: f64) -> f64 {
        top + 20.0 + PANEL_HEIGHT
            - (us.max(1.0).log10() - self.decade_low) / (self.decade_high - self.decade_low)
                * PANEL_HEIGHT
    }
}

/// A panel's title, one rule per decade, and the offered loads under it.
fn grid(body: &mut String, keys: Keys, scale: &Scale, top: f64) {
    let _ = writeln!(
        body,
        "<text x=\"10\" y=\"{}\" {FONT} font-weight=\"bold\">{} keys</text>",
        top + 10.0,
        match keys {
            Keys::Uniform => "Uniform (100,000)",
            Keys::Zipf => "Zipf s = 1.1 (1,000)",
        }
    );
    let mut decade = scale.decade_low;
    while decade <= scale.decade_high {
        let at = scale.y(top, 10f64.powf(decade));
        let _ = writeln!(
            body,
            "<line x1=\"{LEFT}\" y1=\"{at:.1}\" x2=\"{}\" y2=\"{at:.1}\" stroke=\"#dddddd\"/>\
             <text x=\"{}\" y=\"{:.1}\" {FONT} text-anchor=\"end\">{}</text>",
            LEFT + PLOT_WIDTH,
            LEFT - 6.0,
            at + 4.0,
            duration_label(10f64.powf(decade)),
        );
        decade += 1.0;
    }
    let axis = top + 20.0 + PANEL_HEIGHT + 16.0;
    for percent in &scale.percents {
        let _ = writeln!(
            body,
            "<text x=\"{:.1}\" y=\"{axis:.1}\" {FONT} text-anchor=\"middle\">{percent} %</text>",
            scale.x(*percent),
        );
    }
}

/// One library's line for one quantile, its points (with their timeouts, on the p50 line), and
/// its legend entry at height `legend`.
fn draw_line(body: &mut String, line: &Series, scale: &Scale, top: f64, legend: f64) {
    let (quantile, lib, points) = line;
    let (label, dash) = LINES
        .iter()
        .find(|(_, label, _)| label == quantile)
        .map_or(("", ""), |(_, label, dash)| (*label, *dash));
    let path: Vec<String> = points
        .iter()
        .map(|point| {
            format!(
                "{:.1},{:.1}",
                scale.x(point.percent),
                scale.y(top, point.us)
            )
        })
        .collect();
    let _ = writeln!(
        body,
        "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\" \
         stroke-dasharray=\"{dash}\"/>",
        path.join(" "),
        colour(lib),
    );
    for point in points {
        let (cx, cy) = (scale.x(point.percent), scale.y(top, point.us));
        let _ = writeln!(
            body,
            "<circle cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"3\" fill=\"{}\"/>",
            colour(lib)
        );
        if point.timeouts > 0.0 && label == "p50" {
            let _ = writeln!(
                body,
                "<text x=\"{:.1}\" y=\"{:.1}\" font-family=\"sans-serif\" \
                 font-size=\"9\" fill=\"{}\">{} t/o</text>",
                cx + 5.0,
                cy - 5.0,
                colour(lib),
                crate::report::thousands(point.timeouts),
            );
        }
    }
    let _ = writeln!(
        body,
        "<line x1=\"{}\" y1=\"{legend:.1}\" x2=\"{}\" y2=\"{legend:.1}\" stroke=\"{}\" \
         stroke-width=\"2\" stroke-dasharray=\"{dash}\"/><text x=\"{}\" y=\"{:.1}\" \
         {FONT}>{} {label}</text>",
        LEFT + PLOT_WIDTH + 12.0,
        LEFT + PLOT_WIDTH + 40.0,
        colour(lib),
        LEFT + PLOT_WIDTH + 46.0,
        legend + 4.0,
        escape(lib),
    );
}

/// Per library and quantile, the points measured on `keys`, in the order of offered load.
fn series(json: &Value, keys: Keys) -> Vec<Series<'_>> {
    let mut series: Vec<Series> = Vec::new();
    for (section_keys, percent, section) in OPEN_LOOP {
        if section_keys != keys {
            continue;
        }
        for (lib, result) in super::rows(json, section) {
            for (key, label, _) in LINES {
                let Some(us) = result.get(key).and_then(Value::as_f64) else {
                    continue;
                };
                let timeouts = result
                    .get("timeouts")
                    .and_then(Value::as_f64)
                    .unwrap_or(0.0);
                let point = Point {
                    percent,
                    us,
                    timeouts,
                };
                match series.iter_mut().find(|(q, l, _)| q == label && *l == lib) {
                    Some((_, _, points)) => points.push(point),
                    None => series.push((label.to_owned(), lib, vec![point])),
                }
            }
        }
    }
    series
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_line_per_library_and_quantile_with_timeouts_marked() {
        let run = json!({
            "results": {
                "open_uniform_25": {
                    "distlock": {"p50_us": 300.0, "p99_us": 900.0, "timeouts": 0.0},
                    "rslock": {"p50_us": 250.0, "p99_us": 800.0, "timeouts": 0.0},
                    "redlock": {"na": "blocking"}
                },
                "open_uniform_50": {
                    "distlock": {"p50_us": 400.0, "p99_us": 2000.0, "timeouts": 0.0},
                    "rslock": {"p50_us": 500000.0, "p99_us": 1500000.0, "timeouts": 1234.0}
                }
            }
        });
        let svg = draw(&run);
        assert_eq!(svg.matches("<polyline").count(), 4, "{svg}");
        assert_eq!(svg.matches("<circle").count(), 8, "{svg}");
        assert!(svg.contains(">1,234 t/o<"), "{svg}");
        assert!(svg.contains(">100 µs<") && svg.contains(">10 s<"), "{svg}");
        assert!(
            !svg.contains("Zipf"),
            "no Zipf section, no Zipf panel: {svg}"
        );
    }
}
