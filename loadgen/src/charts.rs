//! Draws the charts of BENCHMARKS.md and the README from the load generator's JSON, and writes
//! the tables of that run into BENCHMARKS.md between its `<!-- run:begin -->` and
//! `<!-- run:end -->` marks, so the figures, the charts and the run are always the same.
//!
//! ```text
//! cargo run --release -p idemstore-loadgen -- --scenario all --passes 3 --save run.json
//! cargo run --release -p idemstore-loadgen --bin charts -- run.json
//! ```
//!
//! Writes `docs/charts/throughput.svg` (operations per second of every engine, one panel per
//! scenario) and `docs/charts/latency.svg` (p50 and p99 of every engine in the scenarios where
//! one operation waits for its own durability), relative to the workspace root, or to the
//! directory given as the second argument.

use std::error::Error;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use serde::Deserialize;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// The part of the load generator's report the charts read (`src/report.rs`, `Report`).
#[derive(Deserialize)]
struct Report {
    passes: u32,
    medians: Vec<Row>,
}

/// One engine in one scenario: medians over the passes.
#[derive(Deserialize, Clone)]
struct Row {
    scenario: String,
    engine: String,
    clients: usize,
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us_per_op: Option<f64>,
}

/// What each scenario measures, in the order the charts show them.
const SCENARIOS: [(&str, &str); 7] = [
    ("reserve-1", "durable reserves of new keys, 1 thread"),
    ("reserve-32", "durable reserves of new keys, 32 threads"),
    ("cycle-32", "reserve + complete, 32 threads"),
    ("batch-new", "batches of 1000 new keys"),
    ("batch-duplicate", "batches of 1000 stored keys"),
    ("duplicate-1", "reserves of stored keys, 1 thread"),
    ("async-1000", "1000 tokio tasks, reserve + complete"),
];

/// The scenarios whose latency chart means something: one operation waits for its own commit.
const LATENCY: [&str; 3] = ["reserve-1", "reserve-32", "cycle-32"];

const IDEMSTORE: RGBColor = RGBColor(0xd9, 0x48, 0x1c);
const PEER: RGBColor = RGBColor(0x5b, 0x7f, 0xa6);
const P99: RGBColor = RGBColor(0xb8, 0xc9, 0xdc);

fn main() -> Result<()> {
    let mut args = std::env::args_os().skip(1);
    let Some(json) = args.next().map(PathBuf::from) else {
        return Err("usage: charts RUN.json [WORKSPACE_ROOT] (RUN.json from the load generator's --save or --json)".into());
    };
    let root = args.next().map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."),
        PathBuf::from,
    );
    let text =
        std::fs::read_to_string(&json).map_err(|e| format!("reading {}: {e}", json.display()))?;
    let report: Report = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a load generator report: {e}", json.display()))?;
    let scenarios: Vec<(&str, &str, Vec<Row>)> = SCENARIOS
        .iter()
        .map(|&(name, what)| (name, what, rows(&report, name)))
        .filter(|(_, _, rows)| !rows.is_empty())
        .collect();
    if scenarios.is_empty() {
        return Err(format!("{} has no rows of the known scenarios", json.display()).into());
    }
    let charts = root.join("docs/charts");
    std::fs::create_dir_all(&charts).map_err(|e| format!("creating {}: {e}", charts.display()))?;
    throughput(&charts.join("throughput.svg"), &scenarios)?;
    latency(&charts.join("latency.svg"), &scenarios)?;
    let benchmarks = root.join("BENCHMARKS.md");
    write_tables(&benchmarks, &report, &scenarios)?;
    println!(
        "wrote {}, {} and the tables of {}",
        charts.join("throughput.svg").display(),
        charts.join("latency.svg").display(),
        benchmarks.display()
    );
    Ok(())
}

/// The medians of one scenario, fastest first.
fn rows(report: &Report, scenario: &str) -> Vec<Row> {
    let mut rows: Vec<Row> = report
        .medians
        .iter()
        .filter(|r| r.scenario == scenario)
        .cloned()
        .collect();
    rows.sort_by(|a, b| b.ops_per_sec.total_cmp(&a.ops_per_sec));
    rows
}

fn color(engine: &str) -> RGBColor {
    if engine.starts_with("idemstore") {
        IDEMSTORE
    } else {
        PEER
    }
}

/// "12.3k", "1.95M": short enough for a bar's label.
fn short(v: f64) -> String {
    match v {
        v if v >= 1e6 => format!("{:.2}M", v / 1e6),
        v if v >= 1e4 => format!("{:.0}k", v / 1e3),
        v if v >= 1e3 => format!("{:.1}k", v / 1e3),
        v => format!("{v:.0}"),
    }
}

fn throughput(path: &Path, scenarios: &[(&str, &str, Vec<Row>)]) -> Result<()> {
    let cols = 2;
    let rows = scenarios.len().div_ceil(cols);
    let area = SVGBackend::new(path, (1100, 280 * rows as u32)).into_drawing_area();
    area.fill(&WHITE)?;
    let (title, body) = area.split_vertically(36);
    title.titled(
        "Operations per second (keys, for batches): idemstore and the engines a user would pick instead",
        ("sans-serif", 18),
    )?;
    for (panel, (name, what, rows)) in body.split_evenly((rows, cols)).iter().zip(scenarios) {
        bars(
            panel,
            &format!("{name}: {what}"),
            rows.iter()
                .map(|r| (r.engine.as_str(), vec![(r.ops_per_sec, color(&r.engine))]))
                .collect(),
            "ops/s",
        )?;
    }
    area.present()?;
    Ok(())
}

fn latency(path: &Path, scenarios: &[(&str, &str, Vec<Row>)]) -> Result<()> {
    let shown: Vec<_> = scenarios
        .iter()
        .filter(|(name, _, _)| LATENCY.contains(name))
        .collect();
    if shown.is_empty() {
        return Ok(());
    }
    let area = SVGBackend::new(path, (1100, 300 * shown.len() as u32)).into_drawing_area();
    area.fill(&WHITE)?;
    let (title, body) = area.split_vertically(36);
    title.titled(
        "Latency of one durable operation, µs: p50 (dark) and p99 (light), lower is better",
        ("sans-serif", 18),
    )?;
    for (panel, (name, what, rows)) in body.split_evenly((shown.len(), 1)).iter().zip(shown) {
        let mut rows = rows.clone();
        rows.sort_by(|a, b| a.p50_us.total_cmp(&b.p50_us));
        bars(
            panel,
            &format!("{name}: {what}"),
            rows.iter()
                .map(|r| {
                    (
                        r.engine.as_str(),
                        vec![(r.p99_us, P99), (r.p50_us, color(&r.engine))],
                    )
                })
                .collect(),
            "µs",
        )?;
    }
    area.present()?;
    Ok(())
}

/// Horizontal bars, one row per engine; each row's bars are drawn over each other in order
/// (the widest first), and the last one's value is written after it.
fn bars(
    panel: &DrawingArea<SVGBackend<'_>, Shift>,
    caption: &str,
    rows: Vec<(&str, Vec<(f64, RGBColor)>)>,
    unit: &str,
) -> Result<()> {
    let max = rows
        .iter()
        .flat_map(|(_, bars)| bars.iter().map(|b| b.0))
        .fold(0.0, f64::max)
        .max(1.0);
    let n = rows.len() as i32;
    let mut chart = ChartBuilder::on(panel)
        .caption(caption, ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(24)
        .y_label_area_size(130)
        .build_cartesian_2d(0.0..max * 1.22, 0..n)?;
    let names: Vec<String> = rows.iter().map(|(name, _)| name.to_string()).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(rows.len() + 1)
        .y_label_formatter(&|i| {
            let at = n - 1 - *i;
            usize::try_from(at)
                .ok()
                .and_then(|at| names.get(at).cloned())
                .unwrap_or_default()
        })
        .y_label_offset(-12)
        .x_labels(5)
        .x_label_formatter(&|v| short(*v))
        .x_desc(unit)
        .draw()?;
    for (i, (_, bars)) in rows.iter().enumerate() {
        let y = n - 1 - i as i32;
        for &(value, color) in bars {
            chart.draw_series(std::iter::once(Rectangle::new(
                [(0.0, y), (value, y + 1)],
                color.filled(),
            )))?;
        }
        if let Some(&(value, _)) = bars.last() {
            let widest = bars.iter().map(|b| b.0).fold(0.0, f64::max);
            let label = if bars.len() > 1 {
                format!("{} / {}", short(value), short(widest))
            } else {
                short(value)
            };
            chart.draw_series(std::iter::once(Text::new(
                label,
                (widest + max * 0.01, y + 1),
                ("sans-serif", 12),
            )))?;
        }
    }
    Ok(())
}

/// Replaces what lies between the run marks of BENCHMARKS.md with this run's tables.
fn write_tables(path: &Path, report: &Report, scenarios: &[(&str, &str, Vec<Row>)]) -> Result<()> {
    const BEGIN: &str = "<!-- run:begin -->";
    const END: &str = "<!-- run:end -->";
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let (Some(begin), Some(end)) = (text.find(BEGIN), text.find(END)) else {
        return Err(format!("{} has no {BEGIN} ... {END} marks", path.display()).into());
    };
    let mut tables = format!(
        "{BEGIN}\n<!-- written by the charts tool from the load generator's JSON; edit the tool, not this -->\n\nMedians of {} passes.\n",
        report.passes
    );
    for (name, what, rows) in scenarios {
        let idemstore = rows.iter().find(|r| r.engine == "idemstore");
        let _ = write!(
            tables,
            "\n### `{name}`: {what}\n\n| engine | clients | ops/s | idemstore ÷ it | p50 µs | p99 µs | CPU µs/op |\n|---|---:|---:|---:|---:|---:|---:|\n"
        );
        for r in rows {
            let ratio = match idemstore {
                Some(i) if r.ops_per_sec > 0.0 => format!("{:.2}x", i.ops_per_sec / r.ops_per_sec),
                _ => "-".to_string(),
            };
            let cpu = r
                .cpu_us_per_op
                .map_or("-".to_string(), |c| format!("{c:.1}"));
            let _ = writeln!(
                tables,
                "| {} | {} | {:.0} | {ratio} | {:.0} | {:.0} | {cpu} |",
                r.engine, r.clients, r.ops_per_sec, r.p50_us, r.p99_us
            );
        }
    }
    let out = format!("{}{tables}\n{}", &text[..begin], &text[end..]);
    std::fs::write(path, out).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(())
}
