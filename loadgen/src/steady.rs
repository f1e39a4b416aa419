//! The `steady` scenario: every engine at steady state, where the store holds a full retention
//! window and each new batch of keys meets one old batch expiring.
//!
//! idemstore runs `examples/scale/steady.rs` (included below, so the example and the load
//! generator measure the same code). The peers run the same batches of the same keys (16-byte
//! ids, a fingerprint, 16-byte results: a batch is an insert-if-absent of 1000 new keys, made
//! durable, then their completions, made durable), each expiring keys its own way:
//! - Redis (`appendfsync always`) expires keys itself: each reserve is `SET key value NX PX
//!   ttl` and each completion `SET key value PX ttl`, in one pipeline per batch each. Its
//!   clock is real time, so the retention is set from its own pace: before each batch, the
//!   window's batches times the mean batch time so far. What is live is known from each
//!   batch's expiry instant; what is stored is `DBSIZE`.
//! - fjall expires as its docs recommend for TTL data: a compaction filter drops the items
//!   whose expiry (the value's first 8 bytes) has passed when compaction rewrites them, and a
//!   read takes an expired item as absent. Its clock is the same manual clock as idemstore's
//!   (one step per batch). What is stored is `approximate_len`: every version not yet
//!   compacted away (a key's pending and completed values count twice until compaction merges
//!   them), so its expired-but-stored figure is an upper bound.

#[path = "../../examples/scale/steady.rs"]
pub mod core;

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fjall::compaction::filter::{CompactionFilter, Context, Factory, ItemAccessor, Verdict};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use idemstore::Fingerprint;
use redis::Value;
use serde_json::{json, Value as Json};

use self::core::{cpu_time, fill_segment, id, load_average, rss_bytes, Rate, Segment, BATCH};
use crate::peers::{context, BenchResult, Engine, Redis};

/// What a peer reports about itself when a segment ends.
#[derive(Default)]
struct Sample {
    stored: u64,
    expired_deleted: u64,
    file_bytes: u64,
    log_bytes: u64,
    rss_bytes: u64,
    /// A server's CPU time so far (Redis); zero in process.
    server_cpu: Duration,
}

/// One peer's steady-state operations.
trait Peer {
    /// Moves the peer's clock one step (a window is `per_window` steps).
    fn step(&mut self);
    /// Writes batch `b`: reserves of its new keys, made durable, then their completions.
    fn write_batch(&mut self, b: u64) -> BenchResult<()>;
    /// Keys within their retention, `b` batches written.
    fn live(&self, b: u64) -> u64;
    /// Batches whose keys stay live through the next 1000 duplicates (None: none is).
    fn live_batches(&self, b: u64) -> Option<std::ops::Range<u64>>;
    fn sample(&mut self) -> BenchResult<Sample>;
    /// A reserve of stored key `n`, which must find it.
    fn duplicate(&mut self, n: u64) -> BenchResult<()>;
}

/// A peer's run: its segments, the empty and steady summaries, duplicates at steady state.
pub struct PeerRun {
    pub segments: Vec<Segment>,
    pub empty: Segment,
    pub steady: Segment,
    pub duplicates_steady: Rate,
    /// Redis: `used_memory` per stored key at the end.
    pub memory_per_key: Option<f64>,
}

fn flat(n: u64) -> Vec<u8> {
    format!("tenant:op:{}", id(n)).into_bytes()
}

fn fingerprint(n: u64) -> [u8; 32] {
    *Fingerprint::of(id(n).as_bytes()).as_bytes()
}

fn run_peer(
    peer: &mut dyn Peer,
    window: u64,
    turnovers: u64,
    report: &mut dyn FnMut(&Segment),
) -> BenchResult<PeerRun> {
    let per_window = window / BATCH;
    let per_segment = per_window / 10;
    let empty_batches = (100_000 / BATCH).min(per_segment);
    let total = per_window * (1 + turnovers);
    let mut latency = Vec::with_capacity(total as usize);
    let (mut steady_cpu, mut steady_seconds) = (Duration::ZERO, 0.0);
    let (mut empty_cpu, mut empty_seconds) = (Duration::ZERO, 0.0);
    let mut segments: Vec<Segment> = Vec::new();
    let mut last = peer.sample()?;
    let mut b = 0;
    while b < total {
        let (cpu, started) = (cpu_time(), Instant::now());
        let end = (b + per_segment).min(total);
        let first = b;
        while b < end {
            peer.step();
            let before = Instant::now();
            peer.write_batch(b)?;
            latency.push(before.elapsed().as_secs_f64());
            b += 1;
            if b == empty_batches {
                let server = peer.sample()?.server_cpu.saturating_sub(last.server_cpu);
                empty_cpu = cpu_time().saturating_sub(cpu) + server;
                empty_seconds = started.elapsed().as_secs_f64();
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        let sample = peer.sample()?;
        let cpu =
            cpu_time().saturating_sub(cpu) + sample.server_cpu.saturating_sub(last.server_cpu);
        let live = peer.live(b);
        let mut segment = Segment {
            phase: if first < per_window { "fill" } else { "steady" },
            windows: b as f64 / per_window as f64,
            keys_written: b * BATCH,
            live,
            stored: sample.stored,
            expired_present: sample.stored.saturating_sub(live),
            expired_deleted: sample.expired_deleted - last.expired_deleted,
            file_bytes: sample.file_bytes,
            log_bytes: sample.log_bytes,
            rss_bytes: sample.rss_bytes,
            load: load_average(),
            ..Segment::default()
        };
        fill_segment(
            &mut segment,
            &latency[first as usize..b as usize],
            seconds,
            cpu,
        );
        if first >= per_window {
            steady_cpu += cpu;
            steady_seconds += seconds;
        }
        report(&segment);
        segments.push(segment);
        last = sample;
    }
    let mut empty = Segment {
        phase: "empty",
        keys_written: empty_batches * BATCH,
        ..segments[0].clone()
    };
    fill_segment(
        &mut empty,
        &latency[..empty_batches as usize],
        empty_seconds,
        empty_cpu,
    );
    let mut steady = Segment {
        phase: "steady",
        windows: turnovers as f64,
        ..segments.last().cloned().unwrap_or_default()
    };
    fill_segment(
        &mut steady,
        &latency[per_window as usize..],
        steady_seconds,
        steady_cpu,
    );
    steady.expired_deleted = segments
        .iter()
        .filter(|s| s.phase == "steady")
        .map(|s| s.expired_deleted)
        .sum();
    let mut random = core::Random::new(0x5EED);
    let (cpu, server, started) = (cpu_time(), peer.sample()?.server_cpu, Instant::now());
    let mut ops = 0;
    while started.elapsed() < core::DUPLICATE_TIME {
        // Redis's live keys move with real time: drawn again every 1000. When its window is
        // shorter than the run (small --keys), the run ends when the last batch expires.
        let Some(live) = peer.live_batches(b) else {
            break;
        };
        let span = (live.end - live.start) * BATCH;
        for _ in 0..1000 {
            peer.duplicate(live.start * BATCH + random.below(span))?;
        }
        ops += 1000;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_time().saturating_sub(cpu) + peer.sample()?.server_cpu.saturating_sub(server);
    Ok(PeerRun {
        segments,
        empty,
        steady,
        duplicates_steady: Rate {
            per_sec: ops as f64 / seconds,
            cpu_us: cpu.as_secs_f64() * 1e6 / ops.max(1) as f64,
            ops,
        },
        memory_per_key: None,
    })
}

// --- fjall ---------------------------------------------------------------------------------

/// Drops expired items (the value's first 8 bytes: the expiry in ms, big-endian) when
/// compaction rewrites them. `Destroy` leaves no tombstone: an older version of the same key
/// (its pending record) expires at the same time, and reads take an expired item as absent.
struct TtlFilter {
    now: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
}

impl CompactionFilter for TtlFilter {
    fn filter_item(
        &mut self,
        item: ItemAccessor<'_>,
        _: &Context,
    ) -> fjall::compaction::filter::CompactionFilterResult {
        let value = item.value()?;
        let expiry = value.get(..8).map_or(u64::MAX, |b| {
            u64::from_be_bytes(b.try_into().expect("8 bytes"))
        });
        if expiry <= self.now.load(Ordering::Relaxed) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            Ok(Verdict::Destroy)
        } else {
            Ok(Verdict::Keep)
        }
    }
}

struct TtlFactory {
    now: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
}

impl Factory for TtlFactory {
    fn name(&self) -> &str {
        "ttl"
    }

    fn make_filter(&self, _: &Context) -> Box<dyn CompactionFilter> {
        Box::new(TtlFilter {
            now: Arc::clone(&self.now),
            dropped: Arc::clone(&self.dropped),
        })
    }
}

struct FjallPeer {
    db: Database,
    keys: Keyspace,
    now: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
    step_ms: u64,
    retention_ms: u64,
    per_window: u64,
    rss_before: u64,
}

impl FjallPeer {
    fn open(dir: &Path, per_window: u64) -> BenchResult<FjallPeer> {
        let now = Arc::new(AtomicU64::new(1_700_000_000_000));
        let dropped = Arc::new(AtomicU64::new(0));
        let factory: Arc<dyn Factory> = Arc::new(TtlFactory {
            now: Arc::clone(&now),
            dropped: Arc::clone(&dropped),
        });
        let rss_before = rss_bytes();
        let db = Database::builder(dir.join("fjall"))
            .with_compaction_filter_factories(Arc::new(move |name: &str| {
                (name == "reservations").then(|| Arc::clone(&factory))
            }))
            .open()
            .map_err(context("fjall: open"))?;
        let keys = db
            .keyspace("reservations", KeyspaceCreateOptions::default)
            .map_err(context("fjall: keyspace"))?;
        let retention_ms = idemstore::Builder::DEFAULT_RETENTION.as_millis() as u64;
        Ok(FjallPeer {
            db,
            keys,
            now,
            dropped,
            step_ms: retention_ms / per_window,
            retention_ms,
            per_window,
            rss_before,
        })
    }

    fn value(&self, n: u64, state: u8, result: &[u8]) -> Vec<u8> {
        let expiry = self.now.load(Ordering::Relaxed) + self.retention_ms;
        let mut value = Vec::with_capacity(41 + result.len());
        value.extend_from_slice(&expiry.to_be_bytes());
        value.extend_from_slice(&fingerprint(n));
        value.push(state);
        value.extend_from_slice(result);
        value
    }

    /// The stored value of key `n` unless absent or expired.
    fn get(&self, n: u64) -> BenchResult<Option<fjall::UserValue>> {
        let got = self.keys.get(flat(n)).map_err(context("fjall: get"))?;
        Ok(got.filter(|v| {
            v.get(..8).is_some_and(|b| {
                u64::from_be_bytes(b.try_into().expect("8 bytes"))
                    > self.now.load(Ordering::Relaxed)
            })
        }))
    }
}

impl Peer for FjallPeer {
    fn step(&mut self) {
        self.now.fetch_add(self.step_ms, Ordering::Relaxed);
    }

    fn write_batch(&mut self, b: u64) -> BenchResult<()> {
        for n in b * BATCH..(b + 1) * BATCH {
            if self.get(n)?.is_some() {
                return Err(format!("fjall: new key {n} was there").into());
            }
            self.keys
                .insert(flat(n), self.value(n, 0, &[]))
                .map_err(context("fjall: insert"))?;
        }
        self.db
            .persist(PersistMode::SyncData)
            .map_err(context("fjall: persist"))?;
        let result = [b'r'; core::RESULT_LEN];
        for n in b * BATCH..(b + 1) * BATCH {
            self.keys
                .insert(flat(n), self.value(n, 1, &result))
                .map_err(context("fjall: insert"))?;
        }
        self.db
            .persist(PersistMode::SyncData)
            .map_err(context("fjall: persist"))
    }

    fn live(&self, b: u64) -> u64 {
        b.min(self.per_window) * BATCH
    }

    fn live_batches(&self, b: u64) -> Option<std::ops::Range<u64>> {
        Some(b.saturating_sub(self.per_window) + 1..b)
    }

    fn sample(&mut self) -> BenchResult<Sample> {
        let disk = self.db.disk_space().map_err(context("fjall: disk space"))?;
        let journal = self
            .db
            .journal_disk_space()
            .map_err(context("fjall: journal space"))?;
        Ok(Sample {
            stored: self.keys.approximate_len() as u64,
            expired_deleted: self.dropped.load(Ordering::Relaxed),
            file_bytes: disk.saturating_sub(journal),
            log_bytes: journal,
            rss_bytes: rss_bytes().saturating_sub(self.rss_before),
            server_cpu: Duration::ZERO,
        })
    }

    fn duplicate(&mut self, n: u64) -> BenchResult<()> {
        match self.get(n)? {
            Some(v) if v.get(8..40) == Some(&fingerprint(n)[..]) => Ok(()),
            other => Err(format!("fjall: live key {n} read as {other:?}").into()),
        }
    }
}

// --- Redis ---------------------------------------------------------------------------------

struct RedisPeer {
    _server: Redis,
    conn: redis::Connection,
    per_window: u64,
    /// Each batch's expiry instant, by batch number.
    expiries: VecDeque<Instant>,
    written_seconds: f64,
}

fn info_field(info: &str, name: &str) -> f64 {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

impl RedisPeer {
    fn open(dir: &Path, per_window: u64) -> BenchResult<RedisPeer> {
        let server = Redis::open(dir)?;
        let conn = server.connection()?;
        Ok(RedisPeer {
            _server: server,
            conn,
            per_window,
            expiries: VecDeque::new(),
            written_seconds: 0.0,
        })
    }

    fn pipeline(&mut self, pipe: &redis::Pipeline, what: &'static str) -> BenchResult<()> {
        let replies: Vec<Value> = pipe.query(&mut self.conn).map_err(context(what))?;
        match replies.iter().find(|r| !matches!(r, Value::Okay)) {
            Some(other) => Err(format!("{what} answered {other:?}").into()),
            None => Ok(()),
        }
    }
}

impl Peer for RedisPeer {
    fn step(&mut self) {}

    fn write_batch(&mut self, b: u64) -> BenchResult<()> {
        // The retention: a window's batches at the mean pace so far (5 ms a batch at first).
        let mean = if b == 0 {
            0.005
        } else {
            self.written_seconds / b as f64
        };
        let ttl = ((mean * self.per_window as f64 * 1000.0) as u64).max(1);
        let started = Instant::now();
        let mut pipe = redis::pipe();
        for n in b * BATCH..(b + 1) * BATCH {
            let mut value = fingerprint(n).to_vec();
            value.push(0);
            pipe.cmd("SET")
                .arg(flat(n))
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(ttl);
        }
        self.pipeline(&pipe, "redis: SET NX PX")?;
        let mut pipe = redis::pipe();
        for n in b * BATCH..(b + 1) * BATCH {
            let mut value = fingerprint(n).to_vec();
            value.push(1);
            value.extend_from_slice(&[b'r'; core::RESULT_LEN]);
            pipe.cmd("SET").arg(flat(n)).arg(value).arg("PX").arg(ttl);
        }
        self.pipeline(&pipe, "redis: SET PX")?;
        self.written_seconds += started.elapsed().as_secs_f64();
        self.expiries
            .push_back(started + Duration::from_millis(ttl));
        Ok(())
    }

    fn live(&self, _: u64) -> u64 {
        let now = Instant::now();
        self.expiries.iter().filter(|&&e| e > now).count() as u64 * BATCH
    }

    fn live_batches(&self, b: u64) -> Option<std::ops::Range<u64>> {
        let through = Instant::now() + Duration::from_millis(200);
        let first = self.expiries.iter().position(|&e| e > through);
        first.map(|i| i as u64..b)
    }

    fn sample(&mut self) -> BenchResult<Sample> {
        let info: String = redis::cmd("INFO")
            .arg("everything")
            .query(&mut self.conn)
            .map_err(context("redis: INFO"))?;
        let stored: u64 = redis::cmd("DBSIZE")
            .query(&mut self.conn)
            .map_err(context("redis: DBSIZE"))?;
        let cpu = info_field(&info, "used_cpu_user") + info_field(&info, "used_cpu_sys");
        Ok(Sample {
            stored,
            expired_deleted: info_field(&info, "expired_keys") as u64,
            file_bytes: info_field(&info, "aof_current_size") as u64,
            log_bytes: 0,
            rss_bytes: info_field(&info, "used_memory_rss") as u64,
            server_cpu: Duration::from_secs_f64(cpu),
        })
    }

    fn duplicate(&mut self, n: u64) -> BenchResult<()> {
        let mut value = fingerprint(n).to_vec();
        value.push(0);
        let set: Value = redis::cmd("SET")
            .arg(flat(n))
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(1000)
            .query(&mut self.conn)
            .map_err(context("redis: SET NX"))?;
        if set != Value::Nil {
            return Err(format!("redis: live key {n} was not there ({set:?})").into());
        }
        let stored: Option<Vec<u8>> = redis::cmd("GET")
            .arg(flat(n))
            .query(&mut self.conn)
            .map_err(context("redis: GET"))?;
        match stored {
            Some(v) if v.get(..32) == Some(&fingerprint(n)[..]) => Ok(()),
            other => Err(format!("redis: live key {n} read as {other:?}").into()),
        }
    }
}

impl RedisPeer {
    fn memory_per_key(&mut self) -> BenchResult<f64> {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query(&mut self.conn)
            .map_err(context("redis: INFO memory"))?;
        let stored: u64 = redis::cmd("DBSIZE")
            .query(&mut self.conn)
            .map_err(context("redis: DBSIZE"))?;
        Ok(info_field(&info, "used_memory") / stored.max(1) as f64)
    }
}

// --- the scenario --------------------------------------------------------------------------

/// Which engines the scenario runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SteadyEngine {
    Idemstore,
    Fjall,
    Redis,
}

fn segment_json(s: &Segment) -> Json {
    json!({
        "phase": s.phase,
        "windows": s.windows,
        "keys_written": s.keys_written,
        "keys": s.keys,
        "seconds": s.seconds,
        "keys_per_sec": s.keys_per_sec,
        "cpu_us_per_key": s.cpu_us_per_key,
        "p50_ms": s.p50_ms,
        "p99_ms": s.p99_ms,
        "max_ms": s.max_ms,
        "live": s.live,
        "stored": s.stored,
        "expired_present": s.expired_present,
        "expired_deleted": s.expired_deleted,
        "sweep_slices": s.sweep_slices,
        "file_bytes": s.file_bytes,
        "log_bytes": s.log_bytes,
        "disk_bytes_per_live_key": s.disk_per_key(),
        "rss_bytes": s.rss_bytes,
        "load": s.load,
    })
}

fn rate_json(r: &Rate) -> Json {
    json!({ "per_sec": r.per_sec, "cpu_us": r.cpu_us, "ops": r.ops })
}

/// Runs the scenario on each engine in turn (each in a fresh directory under `dir`), printing
/// progress lines on stderr; returns the JSON report and the lines of the table.
pub fn run(
    dir: &Path,
    window: u64,
    turnovers: u64,
    engines: &[SteadyEngine],
) -> BenchResult<(Json, Vec<String>)> {
    if !window.is_multiple_of(BATCH) || window < 10 * BATCH || turnovers == 0 {
        return Err(format!(
            "steady: --keys {window} must be a multiple of {BATCH} and at least {}, and \
             --turnovers at least 1",
            10 * BATCH
        )
        .into());
    }
    let mut lines = vec![format!(
        "steady state: a window of {window} keys, {turnovers} turnovers, batches of {BATCH}; \
         load average {:.1} at the start",
        load_average()
    )];
    let mut results = Vec::new();
    let print = |engine: &str| {
        let engine = engine.to_string();
        move |s: &Segment| eprintln!("{engine:>9} {}", s.line())
    };
    for &engine in engines {
        let tmp = tempfile::tempdir_in(dir)
            .map_err(|e| format!("creating a directory under {}: {e}", dir.display()))?;
        match engine {
            SteadyEngine::Idemstore => {
                let run = core::run_store(
                    tmp.path(),
                    window,
                    turnovers as f64,
                    &mut print("idemstore"),
                )?;
                lines.extend(
                    core::summary(&run)
                        .into_iter()
                        .map(|l| format!("idemstore: {l}")),
                );
                results.push(json!({
                    "engine": "idemstore",
                    "segments": run.segments.iter().map(segment_json).collect::<Vec<_>>(),
                    "empty": segment_json(&run.empty),
                    "steady": segment_json(&run.steady),
                    "reserve32_empty": rate_json(&run.reserve32_empty),
                    "reserve32_steady": rate_json(&run.reserve32_steady),
                    "duplicates_empty": rate_json(&run.duplicates_empty),
                    "duplicates_steady": rate_json(&run.duplicates_steady),
                    "duplicates_recent": rate_json(&run.duplicates_recent),
                    "counted_expired": run.counted_expired,
                    "computed_expired": run.computed_expired,
                    "drain_seconds": run.drain_seconds,
                    "sweep_slices": run.sweep_slices,
                    "swept": run.swept,
                    "file_bytes_drained": run.file_bytes_drained,
                    "log_bytes_drained": run.log_bytes_drained,
                    "rss_bytes_drained": run.rss_bytes_drained,
                    "rss_peak": run.rss_peak,
                }));
            }
            SteadyEngine::Fjall | SteadyEngine::Redis => {
                let per_window = window / BATCH;
                let (name, run) = if engine == SteadyEngine::Fjall {
                    let mut peer = FjallPeer::open(tmp.path(), per_window)?;
                    (
                        "fjall",
                        run_peer(&mut peer, window, turnovers, &mut print("fjall"))?,
                    )
                } else {
                    let mut peer = RedisPeer::open(tmp.path(), per_window)?;
                    let mut run = run_peer(&mut peer, window, turnovers, &mut print("redis"))?;
                    run.memory_per_key = Some(peer.memory_per_key()?);
                    ("redis", run)
                };
                let (e, s) = (&run.empty, &run.steady);
                lines.push(format!(
                    "{name}: batches: empty {:.0} keys/s, {:.1} µs CPU/key; steady {:.0} keys/s \
                     ({:.2}x), {:.1} µs CPU/key, p50/p99/max {:.1}/{:.1}/{:.1} ms; expired but \
                     stored at the end {} ({} deleted during the steady state); disk {:.0} B \
                     per live key, resident {:.0} MiB{}; duplicates of random live keys {:.0}/s \
                     ({:.2} µs CPU)",
                    e.keys_per_sec,
                    e.cpu_us_per_key,
                    s.keys_per_sec,
                    s.keys_per_sec / e.keys_per_sec,
                    s.cpu_us_per_key,
                    s.p50_ms,
                    s.p99_ms,
                    s.max_ms,
                    s.expired_present,
                    s.expired_deleted,
                    s.disk_per_key(),
                    s.rss_bytes as f64 / (1 << 20) as f64,
                    run.memory_per_key
                        .map_or(String::new(), |m| format!(", used_memory {m:.0} B per key")),
                    run.duplicates_steady.per_sec,
                    run.duplicates_steady.cpu_us
                ));
                results.push(json!({
                    "engine": name,
                    "segments": run.segments.iter().map(segment_json).collect::<Vec<_>>(),
                    "empty": segment_json(&run.empty),
                    "steady": segment_json(&run.steady),
                    "duplicates_steady": rate_json(&run.duplicates_steady),
                    "memory_bytes_per_key": run.memory_per_key,
                }));
            }
        }
    }
    let report = json!({
        "scenario": "steady",
        "window": window,
        "turnovers": turnovers,
        "batch": BATCH,
        "result_len": core::RESULT_LEN,
        "payload_bytes_per_key": core::PAYLOAD,
        "engines": results,
    });
    Ok((report, lines))
}
