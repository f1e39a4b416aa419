//! Draws the charts of BENCHMARKS.md and the README from the load generator's JSON, and writes
//! the tables of that run into BENCHMARKS.md between its `<!-- run:begin -->` and
//! `<!-- run:end -->` marks, so the figures, the charts and the run are always the same.
//!
//! ```text
//! cargo run --release -p idemstore-loadgen -- --scenario all --passes 3 --save run.json
//! cargo run --release -p idemstore-loadgen --bin charts -- run.json
//! # the steady-state run over time (docs/charts/steady.svg):
//! cargo run --release -p idemstore-loadgen -- --scenario steady --save steady.json
//! cargo run --release -p idemstore-loadgen --bin charts -- steady.json
//! # the example's steady runs at several sizes, as printed (docs/charts/scale.svg):
//! cargo run --release --example scale -- steady 10000000 1 > 10m.txt
//! cargo run --release -p idemstore-loadgen --bin charts -- 1m.txt 10m.txt 100m.txt
//! ```
//!
//! Writes `docs/charts/throughput.svg` (operations per second of every engine, one panel per
//! scenario) and `docs/charts/latency.svg` (p50 and p99 of every engine in the scenarios where
//! one operation waits for its own durability), and from a steady run `docs/charts/steady.svg`
//! (rate, batch p99 and expired records still stored over the run), and from the example's
//! printed runs `docs/charts/scale.svg` (the same, a line per size), under the workspace root
//! or the directory given with `--root`.

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

const USAGE: &str = "usage: charts [--root WORKSPACE_ROOT] REPORT.json... RUN.txt... (reports \
    from the load generator's --save or --json: the scenarios' run, and the steady scenario's; \
    runs of `scale -- steady` as printed, drawn together in docs/charts/scale.svg)";

fn main() -> Result<()> {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut root = workspace.canonicalize().unwrap_or(workspace);
    let mut reports = Vec::new();
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--root" {
            root = args.next().map(PathBuf::from).ok_or(USAGE)?;
        } else {
            reports.push(PathBuf::from(arg));
        }
    }
    if reports.is_empty() {
        return Err(USAGE.into());
    }
    let charts = root.join("docs/charts");
    std::fs::create_dir_all(&charts).map_err(|e| format!("creating {}: {e}", charts.display()))?;
    // Runs of the example (`scale -- steady`) as printed: one line each, on one chart.
    let (printed, reports): (Vec<PathBuf>, Vec<PathBuf>) = reports
        .into_iter()
        .partition(|path| path.extension().is_some_and(|e| e == "txt"));
    if !printed.is_empty() {
        let engines = printed
            .iter()
            .map(|path| printed_run(path))
            .collect::<Result<Vec<_>>>()?;
        let path = charts.join("scale.svg");
        steady_chart(&path, &SteadyReport { engines })?;
        println!("wrote {}", path.display());
    }
    for json in reports {
        let text = std::fs::read_to_string(&json)
            .map_err(|e| format!("reading {}: {e}", json.display()))?;
        if let Ok(steady) = serde_json::from_str::<SteadyReport>(&text) {
            let path = charts.join("steady.svg");
            steady_chart(&path, &steady)?;
            println!("wrote {}", path.display());
            continue;
        }
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
    }
    Ok(())
}

/// A run of `cargo run --release --example scale -- steady KEYS ...` as it printed: its
/// segment lines (`fill` or `steady`, windows, live keys, expired-stored, keys/s, CPU per key,
/// `p50/p99/max`), named after its window's live keys.
fn printed_run(path: &Path) -> Result<SteadyEngine> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let bad = |line: &str| format!("{}: not a segment line: {line}", path.display());
    let mut window = None;
    let mut segments = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("steady state: a window of ") {
            window = rest
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<f64>().ok());
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        if !matches!(fields.first(), Some(&"fill") | Some(&"steady")) || fields.len() < 12 {
            continue;
        }
        let number = |i: usize| fields[i].parse::<f64>().map_err(|_| bad(line));
        let latency = line
            .split("p50/p99/max")
            .nth(1)
            .and_then(|rest| rest.split(" ms").next())
            .ok_or_else(|| bad(line))?
            .replace(' ', "");
        let p99 = latency.split('/').nth(1).ok_or_else(|| bad(line))?;
        segments.push(Segment {
            windows: number(1)?,
            live: number(2)?,
            expired_present: number(4)?,
            keys_per_sec: number(6)?,
            p99_ms: p99.parse().map_err(|_| bad(line))?,
        });
    }
    let keys = window.ok_or_else(|| format!("{}: no `steady state:` line", path.display()))?;
    Ok(SteadyEngine {
        engine: format!("{}M live keys", keys / 1e6),
        segments,
    })
}

/// The steady scenario's report (`--scenario steady`): per engine, one segment per tenth of a
/// retention window.
#[derive(Deserialize)]
struct SteadyReport {
    engines: Vec<SteadyEngine>,
}

#[derive(Deserialize)]
struct SteadyEngine {
    engine: String,
    segments: Vec<Segment>,
}

#[derive(Deserialize)]
struct Segment {
    windows: f64,
    keys_per_sec: f64,
    p99_ms: f64,
    live: f64,
    expired_present: f64,
}

/// One figure of a segment.
type Measure = fn(&Segment) -> f64;

/// Rate, batch p99 and expired-but-stored records over the run, one line per engine, with the
/// window turnovers on the x axis.
fn steady_chart(path: &Path, report: &SteadyReport) -> Result<()> {
    let panels: [(&str, Measure); 3] = [
        (
            "keys per second (batches of 1000: reserve_many, then complete_many)",
            |s| s.keys_per_sec,
        ),
        ("batch p99, ms", |s| s.p99_ms),
        ("expired records still stored, % of live keys", |s| {
            if s.live > 0.0 {
                100.0 * s.expired_present / s.live
            } else {
                0.0
            }
        }),
    ];
    let area = SVGBackend::new(path, (1100, 900)).into_drawing_area();
    area.fill(&WHITE)?;
    let (title, body) = area.split_vertically(36);
    title.titled(
        "At steady state: the first window fills the store, then each new batch meets an expiring one",
        ("sans-serif", 18),
    )?;
    let last = report
        .engines
        .iter()
        .flat_map(|e| e.segments.iter().map(|s| s.windows))
        .fold(1.0, f64::max);
    for (panel, (caption, value)) in body.split_evenly((panels.len(), 1)).iter().zip(panels) {
        let max = report
            .engines
            .iter()
            .flat_map(|e| e.segments.iter().map(value))
            .fold(0.0, f64::max)
            .max(1.0);
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 15))
            .margin(10)
            .x_label_area_size(28)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..last, 0.0..max * 1.1)?;
        chart
            .configure_mesh()
            .x_desc("retention windows written")
            .y_label_formatter(&|v| short(*v))
            .draw()?;
        for (i, engine) in report.engines.iter().enumerate() {
            let color = if engine.engine.starts_with("idemstore") {
                IDEMSTORE
            } else {
                PALETTE[i % PALETTE.len()]
            };
            chart
                .draw_series(LineSeries::new(
                    engine.segments.iter().map(|s| (s.windows, value(s))),
                    color.stroke_width(2),
                ))?
                .label(engine.engine.clone())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    area.present()?;
    Ok(())
}

/// The peers' lines in the steady chart.
const PALETTE: [RGBColor; 3] = [
    RGBColor(0x5b, 0x7f, 0xa6),
    RGBColor(0x3a, 0x9a, 0x5b),
    RGBColor(0x8a, 0x5a, 0xa8),
];

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
    // A scenario with one engine (idemstore's async one) compares nothing: its table says it.
    let scenarios: Vec<_> = scenarios
        .iter()
        .filter(|(_, _, rows)| rows.len() > 1)
        .collect();
    let cols = 2;
    let rows = scenarios.len().div_ceil(cols);
    let area = SVGBackend::new(path, (1100, 280 * rows as u32)).into_drawing_area();
    area.fill(&WHITE)?;
    let (title, body) = area.split_vertically(36);
    title.titled(
        "Operations per second (keys, for batches): idemstore and the engines a user would pick instead",
        ("sans-serif", 18),
    )?;
    for (panel, (name, what, rows)) in body.split_evenly((rows, cols)).iter().zip(&scenarios) {
        bars(
            panel,
            &format!("{name}: {what}"),
            rows.iter()
                .map(|r| (r.engine.as_str(), vec![(r.ops_per_sec, color(&r.engine))]))
                .collect(),
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
    let area = SVGBackend::new(path, (1100, 280 * shown.len() as u32)).into_drawing_area();
    area.fill(&WHITE)?;
    let (title, body) = area.split_vertically(36);
    title.titled(
        "Latency of one durable operation in µs, p50 (left) and p99 (right): lower is better",
        ("sans-serif", 18),
    )?;
    for (row, (name, what, rows)) in body.split_evenly((shown.len(), 1)).iter().zip(shown) {
        let mut rows = rows.clone();
        rows.sort_by(|a, b| b.p50_us.total_cmp(&a.p50_us));
        let (p50, p99) = row.split_horizontally(row.dim_in_pixel().0 / 2);
        bars(
            &p50,
            &format!("{name}, p50: {what}"),
            rows.iter()
                .map(|r| (r.engine.as_str(), vec![(r.p50_us, color(&r.engine))]))
                .collect(),
        )?;
        bars(
            &p99,
            &format!("{name}, p99"),
            rows.iter()
                .map(|r| (r.engine.as_str(), vec![(r.p99_us, color(&r.engine))]))
                .collect(),
        )?;
    }
    area.present()?;
    Ok(())
}

/// Horizontal bars, one row per engine, the first at the top, each with its value after it.
fn bars(
    panel: &DrawingArea<SVGBackend<'_>, Shift>,
    caption: &str,
    rows: Vec<(&str, Vec<(f64, RGBColor)>)>,
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
        .draw()?;
    for (i, (_, bars)) in rows.iter().enumerate() {
        let y = n - 1 - i as i32;
        for &(value, color) in bars {
            chart.draw_series([
                Rectangle::new([(0.0, y), (value, y + 1)], color.filled()),
                // A white edge parts the bars of neighbouring rows.
                Rectangle::new([(0.0, y), (value, y + 1)], WHITE.stroke_width(3)),
            ])?;
        }
        let widest = bars.iter().map(|b| b.0).fold(0.0, f64::max);
        chart.draw_series(std::iter::once(
            EmptyElement::at((widest + max * 0.01, y + 1))
                + Text::new(short(widest), (0, 10), ("sans-serif", 12)),
        ))?;
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
        "{BEGIN}\n<!-- written by the charts tool from the load generator's JSON; edit the tool, not this -->\n\nMedians of {} passes (the command and the machine's load are given above).\n",
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
