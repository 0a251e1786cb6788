//! Three pictures of one run, drawn from its JSON line as plain SVG (no plotting dependency):
//! throughput per library and workload, the wait-time distribution under contention, and the
//! open loop's latency against offered load (`open_loop.rs`).
//!
//! `--svg DIR` writes them after a run; `--plot FILE --svg DIR` redraws them from a saved JSON
//! line (BENCHMARKS.md links the ones in `bench/results/`).

mod open_loop;

use crate::report::thousands;
use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;

/// The throughput panels: section, what is counted, its label.
const THROUGHPUT: [(&str, &str, &str); 8] = [
    (
        "sequential",
        "cycles_per_s",
        "1 task, uncontended: cycles/s",
    ),
    (
        "parallel",
        "cycles_per_s",
        "64 tasks, uncontended: cycles/s",
    ),
    (
        "contended",
        "cs_per_s",
        "8 tasks on one key: critical sections/s",
    ),
    (
        "contended_processes",
        "cs_per_s",
        "2 processes × 4 tasks on one key: critical sections/s",
    ),
    (
        "contended_3_processes",
        "cs_per_s",
        "3 processes × 4 tasks on one key: critical sections/s",
    ),
    (
        "contended_6_processes",
        "cs_per_s",
        "6 processes × 2 tasks on one key: critical sections/s",
    ),
    (
        "redlock_sequential",
        "cycles_per_s",
        "Redlock, 5 masters, 1 task: cycles/s",
    ),
    (
        "redlock_contended",
        "cs_per_s",
        "Redlock, 5 masters, 8 tasks on one key: critical sections/s",
    ),
];

/// The wait panels: section and label.
const WAITS: [(&str, &str); 5] = [
    ("contended", "8 tasks in one process on one key"),
    ("contended_processes", "2 processes × 4 tasks on one key"),
    ("contended_3_processes", "3 processes × 4 tasks on one key"),
    ("contended_6_processes", "6 processes × 2 tasks on one key"),
    ("redlock_contended", "Redlock, 8 tasks on one key"),
];

/// Wait quantiles drawn, in order: key in the JSON, label.
const WAIT_MARKS: [(&str, &str); 4] = [
    ("wait_p50_us", "p50"),
    ("wait_p99_us", "p99"),
    ("wait_max_us", "max"),
    ("wait_max_us_worst", "worst"),
];

const WIDTH: f64 = 860.0;
const LABEL_WIDTH: f64 = 130.0;
const BAR_AREA: f64 = 560.0;
const ROW: f64 = 22.0;
const FONT: &str = "font-family=\"sans-serif\" font-size=\"12\"";

/// Library colours, stable across pictures.
fn colour(lib: &str) -> &'static str {
    match lib {
        "distlock" => "#1f6feb",
        "distlock-fixed" => "#79a8f5",
        "rslock" => "#d9822b",
        "redlock" => "#8f8f8f",
        "fifo-floor" => "#2da44e",
        _ => "#444444",
    }
}

/// Writes `throughput.svg`, `waits.svg` and `open-loop.svg` for `json` into `dir`.
pub(crate) fn write(json: &Value, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir)
        .map_err(|err| format!("cannot create {}: {err}", dir.display()))?;
    for (name, svg) in [
        ("throughput.svg", throughput(json)),
        ("waits.svg", waits(json)),
        ("open-loop.svg", open_loop::draw(json)),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, svg)
            .map_err(|err| format!("cannot write {}: {err}", path.display()))?;
    }
    Ok(())
}

/// Reads a JSON line saved from a run (the last line of its stdout, or the whole file).
pub(crate) fn read(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
    let line = text
        .lines()
        .rev()
        .find(|line| line.trim_start().starts_with('{'))
        .ok_or_else(|| format!("{} holds no JSON line", path.display()))?;
    serde_json::from_str(line).map_err(|err| format!("{}: {err}", path.display()))
}

/// Rows of one section: (library, its result object), in the run's order.
fn rows<'a>(json: &'a Value, section: &str) -> Vec<(&'a str, &'a Value)> {
    json.pointer(&format!("/results/{section}"))
        .and_then(Value::as_object)
        .map(|libs| {
            libs.iter()
                .filter(|(_, result)| result.is_object())
                .map(|(lib, result)| (lib.as_str(), result))
                .collect()
        })
        .unwrap_or_default()
}

/// Horizontal bars, one panel per workload, each with its own scale; every bar is labelled with
/// its value and its ratio to rslock measured in the same run.
fn throughput(json: &Value) -> String {
    let mut body = String::new();
    let mut y = 56.0;
    for (section, key, label) in THROUGHPUT {
        let bars: Vec<(&str, f64, Option<f64>)> = rows(json, section)
            .into_iter()
            .filter_map(|(lib, result)| {
                let value = result.get(key)?.as_f64()?;
                let ratio = result.get("ratio_to_rslock").and_then(Value::as_f64);
                Some((lib, value, ratio))
            })
            .collect();
        if bars.is_empty() {
            continue;
        }
        let top = bars.iter().map(|(_, value, _)| *value).fold(0.0, f64::max);
        let _ = writeln!(
            body,
            "<text x=\"10\" y=\"{y}\" {FONT} font-weight=\"bold\">{}</text>",
            escape(label)
        );
        y += 8.0;
        for (lib, value, ratio) in bars {
            let length = if top > 0.0 {
                value / top * BAR_AREA
            } else {
                0.0
            };
            let ratio = ratio.map_or(String::new(), |r| format!(" · {r:.2}× rslock"));
            let _ = writeln!(
                body,
                "<text x=\"{}\" y=\"{}\" {FONT} text-anchor=\"end\">{lib}</text>\
                 <rect x=\"{LABEL_WIDTH}\" y=\"{y}\" width=\"{length:.1}\" height=\"{}\" \
                 fill=\"{}\"/><text x=\"{:.1}\" y=\"{}\" {FONT}>{}{ratio}</text>",
                LABEL_WIDTH - 6.0,
                y + ROW * 0.7,
                ROW - 6.0,
                colour(lib),
                LABEL_WIDTH + length + 6.0,
                y + ROW * 0.7,
                thousands(value),
            );
            y += ROW;
        }
        y += 18.0;
    }
    frame(
        "Throughput, same server and run (longer is better)",
        &subtitle(json),
        y,
        &body,
    )
}

/// Wait quantiles per library on a log scale: where the lock makes callers wait, and for how long
/// at worst.
fn waits(json: &Value) -> String {
    let mut panels = Vec::new();
    let (mut low, mut high) = (f64::MAX, 0.0_f64);
    for (section, label) in WAITS {
        let libs: Vec<(&str, Vec<(&str, f64)>)> = rows(json, section)
            .into_iter()
            .map(|(lib, result)| {
                let marks = WAIT_MARKS
                    .iter()
                    .filter_map(|(key, mark)| {
                        let value = result.get(*key)?.as_f64()?.max(1.0);
                        Some((*mark, value))
                    })
                    .collect::<Vec<_>>();
                (lib, marks)
            })
            .filter(|(_, marks)| !marks.is_empty())
            .collect();
        for (_, marks) in &libs {
            for (_, value) in marks {
                low = low.min(*value);
                high = high.max(*value);
            }
        }
        if !libs.is_empty() {
            panels.push((label, libs));
        }
    }
    if panels.is_empty() {
        return frame("Waits under contention", &subtitle(json), 80.0, "");
    }
    let (decade_low, decade_high) = (
        low.log10().floor(),
        high.log10().ceil().max(low.log10().floor() + 1.0),
    );
    let x =
        |us: f64| LABEL_WIDTH + (us.log10() - decade_low) / (decade_high - decade_low) * BAR_AREA;
    let mut body = String::new();
    let mut y = 56.0;
    // The scale: one tick per decade.
    let mut decade = decade_low;
    while decade <= decade_high {
        let at = x(10f64.powf(decade));
        let _ = writeln!(
            body,
            "<line x1=\"{at:.1}\" y1=\"{y}\" x2=\"{at:.1}\" y2=\"HEIGHT\" stroke=\"#dddddd\"/>\
             <text x=\"{at:.1}\" y=\"{}\" {FONT} text-anchor=\"middle\">{}</text>",
            y - 4.0,
            duration_label(10f64.powf(decade)),
        );
        decade += 1.0;
    }
    y += 14.0;
    for (label, libs) in panels {
        let _ = writeln!(
            body,
            "<text x=\"10\" y=\"{y}\" {FONT} font-weight=\"bold\">{}</text>",
            escape(label)
        );
        y += 8.0;
        for (lib, marks) in libs {
            let mid = y + ROW / 2.0;
            let first = marks.first().map_or(0.0, |(_, value)| x(*value));
            let last = marks.last().map_or(0.0, |(_, value)| x(*value));
            let _ = writeln!(
                body,
                "<text x=\"{}\" y=\"{}\" {FONT} text-anchor=\"end\">{lib}</text>\
                 <line x1=\"{first:.1}\" y1=\"{mid}\" x2=\"{last:.1}\" y2=\"{mid}\" \
                 stroke=\"{}\" stroke-width=\"3\"/>",
                LABEL_WIDTH - 6.0,
                mid + 4.0,
                colour(lib),
            );
            // Labels alternate above and below the line, so neighbouring marks stay readable.
            for (index, (mark, value)) in marks.into_iter().enumerate() {
                let at = x(value);
                let label_y = if index % 2 == 0 {
                    mid - 6.0
                } else {
                    mid + 14.0
                };
                let _ = writeln!(
                    body,
                    "<circle cx=\"{at:.1}\" cy=\"{mid}\" r=\"4\" fill=\"{}\"/>\
                     <text x=\"{at:.1}\" y=\"{}\" font-family=\"sans-serif\" font-size=\"9\" \
                     text-anchor=\"middle\">{mark}</text>",
                    colour(lib),
                    label_y,
                );
            }
            y += ROW + 8.0;
        }
        y += 14.0;
    }
    let body = body.replace("HEIGHT", &format!("{:.1}", y - 10.0));
    frame(
        "Time a caller waited for the lock under contention (log scale; shorter is better)",
        &subtitle(json),
        y,
        &body,
    )
}

/// The whole picture around `body`, `height` tall.
fn frame(title: &str, subtitle: &str, height: f64, body: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{h:.0}\" \
         viewBox=\"0 0 {WIDTH} {h:.0}\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"20\" font-family=\"sans-serif\" font-size=\"15\" \
         font-weight=\"bold\">{}</text>\n<text x=\"10\" y=\"38\" {FONT} fill=\"#555555\">{}</text>\n\
         {body}</svg>\n",
        escape(title),
        escape(subtitle),
        h = height + 10.0,
    )
}

/// The run's floor and size, so a picture is never read without them.
fn subtitle(json: &Value) -> String {
    let floor = json
        .pointer("/floor/rtt_set_per_s")
        .and_then(Value::as_f64)
        .map_or("floor not measured".to_owned(), |rate| {
            format!("loopback floor {} SET/s on 1 connection", thousands(rate))
        });
    let runs = json
        .pointer("/config/runs")
        .and_then(Value::as_u64)
        .map_or(String::new(), |runs| format!(", medians of {runs} runs"));
    format!("distlock-bench: {floor}{runs}; every library on the same server in the same run")
}

fn duration_label(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{:.0} s", us / 1_000_000.0)
    } else if us >= 1_000.0 {
        format!("{:.0} ms", us / 1_000.0)
    } else {
        format!("{us:.0} µs")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run() -> Value {
        json!({
            "floor": {"rtt_set_per_s": 14000.0},
            "config": {"runs": 3},
            "results": {
                "sequential": {
                    "distlock": {"cycles_per_s": 7000.0, "ratio_to_rslock": 0.9},
                    "rslock": {"cycles_per_s": 7800.0, "ratio_to_rslock": 1.0}
                },
                "contended": {
                    "distlock": {"cs_per_s": 5000.0, "wait_p50_us": 1400.0, "wait_p99_us": 4300.0,
                                 "wait_max_us": 10000.0, "wait_max_us_worst": 15000.0},
                    "rslock": {"cs_per_s": 6400.0, "wait_p50_us": 58.0, "wait_p99_us": 320.0,
                               "wait_max_us": 445000.0, "wait_max_us_worst": 562000.0}
                }
            }
        })
    }

    #[test]
    fn throughput_draws_a_bar_per_library_with_its_ratio() {
        let svg = throughput(&run());
        assert!(svg.starts_with("<svg"), "{svg}");
        assert_eq!(svg.matches("<rect x=\"130\"").count(), 4, "{svg}");
        assert!(svg.contains("7,000 · 0.90× rslock"), "{svg}");
        assert!(svg.contains("loopback floor 14,000 SET/s"), "{svg}");
    }

    #[test]
    fn waits_draw_every_quantile_on_a_log_scale() {
        let svg = waits(&run());
        assert_eq!(svg.matches("<circle").count(), 8, "{svg}");
        assert!(svg.contains(">100 µs<") && svg.contains(">1 s<"), "{svg}");
        assert!(!svg.contains("HEIGHT"), "{svg}");
    }
}
