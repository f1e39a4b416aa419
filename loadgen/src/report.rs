//! The load generator's report: per-pass rows, ratios against the peers of the same scenario
//! and pass, medians over the passes, and the table printed for people.

use std::path::PathBuf;

use serde::Serialize;

use super::peers::{Kind, Workload};
use super::Scenario;

/// One engine in one scenario in one pass.
#[derive(Serialize, Debug, Clone)]
pub(crate) struct Row {
    pub(crate) scenario: String,
    pub(crate) pass: u32,
    pub(crate) engine: &'static str,
    /// Threads, or tasks in the async scenario.
    pub(crate) clients: usize,
    /// Operations done (keys, for batches).
    pub(crate) ops: u64,
    pub(crate) seconds: f64,
    pub(crate) ops_per_sec: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) max_us: f64,
    /// CPU time (user + system) of the process per operation, in µs, for in-process engines.
    pub(crate) cpu_us_per_op: Option<f64>,
    /// ops/s divided by the named engine's in the same scenario and pass (`32 threads`: the
    /// same engine's `cycle-32`), for each that ran.
    pub(crate) vs: Vec<(String, f64)>,
    /// p50 divided by fdatasync's p50 in the same scenario and pass (lower is better; the
    /// one-caller latency target is stated this way).
    pub(crate) p50_vs_fdatasync: Option<f64>,
    /// The page layer's work per operation (idemstore's engines).
    pub(crate) page_work_per_op: Option<PageWork>,
}

/// The page layer's work per operation (`idemstore::whitebox::page_work` over the operations).
#[derive(Serialize, Debug, Clone, Copy)]
pub(crate) struct PageWork {
    /// 4 KiB blocks checksummed (read or written) while the clients ran.
    pub(crate) summed: f64,
    /// The same from the clients' start through the store's close, whose checkpoint writes
    /// every key of the run and of its prefill into the B-tree (an upper bound of the work
    /// one operation brings).
    pub(crate) summed_through_close: f64,
    /// Sums blocks written from the clients' start through the close.
    pub(crate) sums_written_through_close: f64,
}

/// The peers each row is divided by, in column order.
pub(crate) const RATIO_PEERS: [Kind; 7] = [
    Kind::Redis,
    Kind::Redb,
    Kind::RedbCeiling,
    Kind::Fdatasync,
    Kind::Sqlite,
    Kind::GroupLog,
    Kind::Fjall,
];
pub(crate) const VS_THREADS: &str = "32 threads";

#[derive(Serialize, Debug)]
pub(crate) struct Skipped {
    pub(crate) engine: &'static str,
    pub(crate) reason: String,
}

#[derive(Serialize, Debug)]
pub(crate) struct Report {
    pub(crate) stop: String,
    pub(crate) passes: u32,
    pub(crate) batch: u64,
    pub(crate) prefill: u64,
    pub(crate) dir: PathBuf,
    pub(crate) skipped: Vec<Skipped>,
    /// Medians over the passes, per scenario and engine.
    pub(crate) medians: Vec<Row>,
    /// Every pass's figures.
    pub(crate) runs: Vec<Row>,
    /// The page checksums' cost, per scenario where `idemstore` and `idemstore-nopages` both
    /// ran.
    pub(crate) page_checksums: Vec<PageCost>,
    /// CPU time of one page-layer checksum of a 4 KiB block, in µs, timed in this run.
    pub(crate) crc_us_per_block: Option<f64>,
}

/// `idemstore` divided by `idemstore-nopages` in one scenario, pass by pass: what the
/// checksummed page layer costs the same engine.
#[derive(Serialize, Debug)]
pub(crate) struct PageCost {
    pub(crate) scenario: String,
    /// ops/s ratio of each pass (below 1: the checksums cost throughput).
    pub(crate) ops_ratio: Vec<f64>,
    /// CPU/op ratio of each pass (above 1: the checksums cost CPU).
    pub(crate) cpu_ratio: Vec<f64>,
    /// idemstore's CPU/op of each pass, in µs.
    pub(crate) cpu_us_per_op: Vec<f64>,
    /// idemstore's page-layer work per operation, each pass.
    pub(crate) work_per_op: Vec<PageWork>,
}

/// The page checksums' cost in each scenario where both engines ran in the same passes.
pub(crate) fn page_costs(runs: &[Row]) -> Vec<PageCost> {
    let (with, without) = (Kind::Idemstore.name(), Kind::IdemstoreNoPages.name());
    let mut out: Vec<PageCost> = Vec::new();
    for r in runs.iter().filter(|r| r.engine == with) {
        let Some(base) = runs
            .iter()
            .find(|o| o.scenario == r.scenario && o.pass == r.pass && o.engine == without)
        else {
            continue;
        };
        let at = match out.iter().position(|c| c.scenario == r.scenario) {
            Some(at) => at,
            None => {
                out.push(PageCost {
                    scenario: r.scenario.clone(),
                    ops_ratio: Vec::new(),
                    cpu_ratio: Vec::new(),
                    cpu_us_per_op: Vec::new(),
                    work_per_op: Vec::new(),
                });
                out.len() - 1
            }
        };
        out[at].ops_ratio.push(r.ops_per_sec / base.ops_per_sec);
        if let (Some(cpu), Some(base)) = (r.cpu_us_per_op, base.cpu_us_per_op) {
            out[at].cpu_ratio.push(cpu / base);
            out[at].cpu_us_per_op.push(cpu);
        }
        if let Some(work) = r.page_work_per_op {
            out[at].work_per_op.push(work);
        }
    }
    out
}

impl PageWork {
    /// Each figure's median over `work`.
    fn median(work: &[PageWork]) -> PageWork {
        let of = |f: fn(&PageWork) -> f64| median(work.iter().map(f).collect());
        PageWork {
            summed: of(|w| w.summed),
            summed_through_close: of(|w| w.summed_through_close),
            sums_written_through_close: of(|w| w.sums_written_through_close),
        }
    }
}

/// `median 0.98x (0.95-1.01)`: a ratio's median and its spread over the passes.
fn spread(ratios: &[f64]) -> String {
    if ratios.is_empty() {
        return "-".to_string();
    }
    let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let max = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "median {:.3}x ({:.3}-{:.3})",
        median(ratios.to_vec()),
        min,
        max
    )
}

/// Fills in each row's ratios against the peers of its scenario and pass.
pub(crate) fn add_ratios(runs: &mut [Row]) {
    let find = |runs: &[Row], scenario: &str, pass: u32, engine: &str| {
        runs.iter()
            .find(|r| r.scenario == scenario && r.pass == pass && r.engine == engine)
            .map(|r| (r.ops_per_sec, r.p50_us))
    };
    let rate = |runs: &[Row], scenario: &str, pass: u32, engine: &str| {
        find(runs, scenario, pass, engine).map(|(rate, _)| rate)
    };
    for i in 0..runs.len() {
        let (scenario, pass) = (runs[i].scenario.clone(), runs[i].pass);
        let mut vs = Vec::new();
        for peer in RATIO_PEERS {
            if let Some(base) = rate(runs, &scenario, pass, peer.name()) {
                vs.push((peer.name().to_string(), runs[i].ops_per_sec / base));
            }
        }
        if scenario.starts_with("async") {
            if let Some(base) = rate(runs, "cycle-32", pass, runs[i].engine) {
                vs.push((VS_THREADS.to_string(), runs[i].ops_per_sec / base));
            }
        }
        runs[i].vs = vs;
        runs[i].p50_vs_fdatasync = find(runs, &scenario, pass, Kind::Fdatasync.name())
            .map(|(_, p50)| runs[i].p50_us / p50);
    }
}

pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// One row per scenario and engine: medians over the passes (ratios: median of the per-pass
/// ratios).
pub(crate) fn medians(runs: &[Row]) -> Vec<Row> {
    let mut out: Vec<Row> = Vec::new();
    for r in runs {
        if out
            .iter()
            .any(|o| o.scenario == r.scenario && o.engine == r.engine)
        {
            continue;
        }
        let same: Vec<&Row> = runs
            .iter()
            .filter(|o| o.scenario == r.scenario && o.engine == r.engine)
            .collect();
        let of = |f: fn(&Row) -> f64| median(same.iter().map(|r| f(r)).collect());
        let p50_ratios: Vec<f64> = same.iter().filter_map(|r| r.p50_vs_fdatasync).collect();
        let cpu: Vec<f64> = same.iter().filter_map(|r| r.cpu_us_per_op).collect();
        let work: Vec<PageWork> = same.iter().filter_map(|r| r.page_work_per_op).collect();
        let vs =
            r.vs.iter()
                .map(|(peer, _)| {
                    let ratios = same
                        .iter()
                        .filter_map(|o| o.vs.iter().find(|(p, _)| p == peer).map(|(_, v)| *v));
                    (peer.clone(), median(ratios.collect()))
                })
                .collect();
        out.push(Row {
            pass: 0,
            ops: same.iter().map(|r| r.ops).sum(),
            seconds: same.iter().map(|r| r.seconds).sum(),
            ops_per_sec: of(|r| r.ops_per_sec),
            p50_us: of(|r| r.p50_us),
            p99_us: of(|r| r.p99_us),
            max_us: of(|r| r.max_us),
            cpu_us_per_op: (!cpu.is_empty()).then(|| median(cpu)),
            vs,
            p50_vs_fdatasync: (!p50_ratios.is_empty()).then(|| median(p50_ratios)),
            page_work_per_op: (!work.is_empty()).then(|| PageWork::median(&work)),
            ..r.clone()
        });
    }
    out
}

/// `1234567.8` as `1,234,568`.
pub(crate) fn thousands(value: f64) -> String {
    if !value.is_finite() {
        return "-".to_string();
    }
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A latency in µs, in the unit that reads best.
pub(crate) fn latency_text(micros: f64) -> String {
    if micros < 10.0 {
        format!("{micros:.1} µs")
    } else if micros < 1000.0 {
        format!("{micros:.0} µs")
    } else if micros < 10_000.0 {
        format!("{:.2} ms", micros / 1000.0)
    } else {
        format!("{:.1} ms", micros / 1000.0)
    }
}

pub(crate) fn table(report: &Report, scenarios: &[Scenario]) -> String {
    let mut out = format!(
        "{}; {} pass(es), medians; files under {}\n",
        report.stop,
        report.passes,
        report.dir.display()
    );
    for s in &report.skipped {
        out.push_str(&format!("skipped {}: {}\n", s.engine, s.reason));
    }
    let columns: Vec<String> = RATIO_PEERS
        .iter()
        .map(|k| k.name().to_string())
        .chain([VS_THREADS.to_string()])
        .collect();
    for scenario in scenarios {
        let rows: Vec<&Row> = report
            .medians
            .iter()
            .filter(|r| r.scenario == scenario.name)
            .collect();
        if rows.is_empty() {
            continue;
        }
        out.push_str(&format!(
            "\n{} ({} clients): {}\n{:<19} {:>11} {:>9} {:>9} {:>9}",
            scenario.name,
            scenario.clients,
            scenario.describe(),
            "engine",
            "ops/s",
            "p50",
            "p99",
            "CPU/op"
        ));
        let shown: Vec<&String> = columns
            .iter()
            .filter(|c| rows.iter().any(|r| r.vs.iter().any(|(p, _)| p == *c)))
            .collect();
        for c in &shown {
            let head = format!("vs {}", c.replace(" threads", " thr"));
            out.push_str(&format!(" {head:>12}"));
        }
        // One caller writing: the latency target is p50 against one fdatasync.
        let p50_column = scenario.clients == 1
            && scenario.workload() == Workload::Reserve
            && rows.iter().any(|r| r.p50_vs_fdatasync.is_some());
        if p50_column {
            out.push_str(&format!(" {:>14}", "p50/fdatasync"));
        }
        out.push('\n');
        for r in rows {
            out.push_str(&format!(
                "{:<19} {:>11} {:>9} {:>9} {:>9}",
                r.engine,
                thousands(r.ops_per_sec),
                latency_text(r.p50_us),
                latency_text(r.p99_us),
                r.cpu_us_per_op.map_or("-".to_string(), latency_text)
            ));
            for c in &shown {
                let v = r.vs.iter().find(|(p, _)| p == *c);
                out.push_str(&format!(
                    " {:>12}",
                    v.map_or("-".to_string(), |(_, v)| format!("{v:.2}x"))
                ));
            }
            if p50_column {
                let v = r.p50_vs_fdatasync;
                out.push_str(&format!(
                    " {:>14}",
                    v.map_or("-".to_string(), |v| format!("{v:.2}x"))
                ));
            }
            out.push('\n');
        }
    }
    if !report.page_checksums.is_empty() {
        out.push_str(
            "\npage checksums: idemstore / idemstore-nopages, pass by pass (median, min-max)\n",
        );
        if let Some(crc) = report.crc_us_per_block {
            out.push_str(&format!(
                "one checksum of a 4 KiB block: {crc:.3} µs of CPU (timed in this run)\n"
            ));
        }
        for cost in &report.page_checksums {
            let list = |ratios: &[f64]| {
                let each: Vec<String> = ratios.iter().map(|v| format!("{v:.3}")).collect();
                format!("{} [{}]", spread(ratios), each.join(" "))
            };
            out.push_str(&format!(
                "{:<16} ops/s {}\n{:<16} CPU/op {}\n",
                cost.scenario,
                list(&cost.ops_ratio),
                "",
                list(&cost.cpu_ratio)
            ));
            if cost.work_per_op.is_empty() {
                continue;
            }
            let work = PageWork::median(&cost.work_per_op);
            out.push_str(&format!(
                "{:<16} idemstore per op: {:.4} blocks checksummed while the clients ran, {:.4} through the close ({:.5} sums blocks written)",
                "", work.summed, work.summed_through_close, work.sums_written_through_close,
            ));
            if let (Some(crc), false) = (report.crc_us_per_block, cost.cpu_us_per_op.is_empty()) {
                let cpu = median(cost.cpu_us_per_op.clone());
                let bound = work.summed_through_close * crc;
                out.push_str(&format!(
                    "\n{:<16} at {crc:.3} µs each: {bound:.4} µs of idemstore's {cpu:.2} µs CPU/op ({:.2}%)",
                    "",
                    100.0 * bound / cpu
                ));
            }
            out.push('\n');
        }
    }
    out
}
