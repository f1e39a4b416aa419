//! PgStore against bare SQL on the same server, the same client library (tokio-postgres) and
//! the same number of connections, in one run (BENCHMARKS.md, "PostgreSQL").
//!
//! ```text
//! cargo run --release -p idemstore-loadgen --bin pg_bench --features postgres -- \
//!     --config "host=127.0.0.1 port=5432 user=postgres dbname=postgres" --secs 10
//! ```
//!
//! Cells: reserve (new keys) at `--conns` connections against a bare `INSERT ... ON CONFLICT
//! DO NOTHING`; reserve then complete against a bare insert then update; batches of 1000 new
//! keys (`reserve_many`) against a bare multi-row insert; then the steady state: reserve +
//! complete with a retention of `--retention` seconds and a sweeper, for two turnovers,
//! against the same cycle on an empty table of its own, with the table's size per live key.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use idemstore::tokio_postgres::{self, NoTls};
use idemstore::{Fingerprint, Key, PgStore, Reservation};

#[derive(Parser)]
struct Args {
    /// The server's connection string.
    #[arg(long)]
    config: String,
    /// Connections (and tasks) per cell.
    #[arg(long, default_value_t = 32)]
    conns: usize,
    /// Seconds per cell.
    #[arg(long, default_value_t = 10)]
    secs: u64,
    /// Retention of the steady-state cell, seconds (it runs two of them).
    #[arg(long, default_value_t = 30)]
    retention: u64,
    /// Result bytes stored per completion.
    #[arg(long, default_value_t = 64)]
    result: usize,
    /// The PostgreSQL server's process id (the postmaster), when it runs on this machine: each
    /// cell then also reports the server's CPU per operation (the postmaster and its children:
    /// backends, WAL writer, checkpointer, autovacuum).
    #[arg(long)]
    server_pid: Option<u32>,
    /// Only the batch cells (the bare multi-row insert and `reserve_many`), e.g. to profile
    /// them.
    #[arg(long)]
    batch_only: bool,
    /// Without the steady-state cells.
    #[arg(long)]
    skip_steady: bool,
    /// Each pair of cells (a bare peer and the store) runs this many times, alternating, for
    /// `--secs` each: each round's ratio is printed, then the totals. On a machine whose load
    /// moves, alternating short cells gives both sides of a ratio the same conditions.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Build the stores with `PgBuilder::index_stale(true)` (an index of the pending rows,
    /// which completions then update: they are no longer HOT updates).
    #[arg(long)]
    index_stale: bool,
}

/// CPU time of the server's processes (user + system), seconds; 0 without `--server-pid`.
fn server_cpu() -> f64 {
    let Some(pid) = SERVER.get().copied().flatten() else {
        return 0.0;
    };
    let mut total = 0.0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let own: u32 = head
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        let parent: u32 = fields.get(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        if own == pid || parent == pid {
            let ticks = |i: usize| {
                fields
                    .get(i)
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            total += (ticks(11) + ticks(12)) / 100.0;
        }
    }
    total
}

static SERVER: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();

/// CPU time of this process (user + system), seconds.
fn cpu() -> f64 {
    let usage = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = usage
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 (11 and 12 after the state field), in clock ticks.
    (ticks(11) + ticks(12)) / 100.0
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[derive(Default)]
struct Cell {
    ops: u64,
    secs: f64,
    cpu: f64,
    server_cpu: f64,
}

impl Cell {
    fn add(&mut self, other: &Cell) {
        self.ops += other.ops;
        self.secs += other.secs;
        self.cpu += other.cpu;
        self.server_cpu += other.server_cpu;
    }
    fn rate(&self) -> f64 {
        self.ops as f64 / self.secs
    }
    fn show(&self, name: &str, per: &str) {
        println!(
            "{name:<34} {:>9.0} {per}/s  client CPU {:>6.1} us/{per}  server CPU {:>6.1} us/{per}",
            self.rate(),
            self.cpu / self.ops.max(1) as f64 * 1e6,
            self.server_cpu / self.ops.max(1) as f64 * 1e6
        );
    }
}

/// Runs `tasks` copies of `body` for `secs`; each returns how many operations it did.
async fn timed<F, Fut>(tasks: usize, secs: u64, body: F) -> Cell
where
    F: Fn(usize, Arc<AtomicBool>) -> Fut,
    Fut: std::future::Future<Output = u64> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let cpu0 = cpu();
    let server0 = server_cpu();
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| tokio::spawn(body(t, stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut ops = 0;
    for handle in handles {
        ops += handle.await.expect("task");
    }
    Cell {
        ops,
        secs: started.elapsed().as_secs_f64(),
        cpu: cpu() - cpu0,
        server_cpu: server_cpu() - server0,
    }
}

/// Runs a bare cell and the store's cell `rounds` times, alternating, and prints each
/// round's ratio, then both totals and their ratio.
async fn pair<B, BF, S, SF>(
    rounds: usize,
    secs: u64,
    names: [&str; 3],
    per: &str,
    bare: B,
    store: S,
) where
    B: Fn(u64) -> BF,
    BF: std::future::Future<Output = Cell>,
    S: Fn(u64) -> SF,
    SF: std::future::Future<Output = Cell>,
{
    if rounds > 1 {
        // One second of each, not counted: the first cell of a run otherwise also pays for
        // its connections' first statements and the table's first pages.
        bare(1).await;
        store(1).await;
    }
    let (mut bare_total, mut store_total) = (Cell::default(), Cell::default());
    for round in 0..rounds {
        let b = bare(secs).await;
        let s = store(secs).await;
        if rounds > 1 {
            println!(
                "  round {}: {} {:.0}/s, {} {:.0}/s: {:.2}x (load {})",
                round + 1,
                names[0],
                b.rate(),
                names[1],
                s.rate(),
                s.rate() / b.rate(),
                load()
            );
        }
        bare_total.add(&b);
        store_total.add(&s);
    }
    bare_total.show(names[0], per);
    store_total.show(names[1], per);
    println!(
        "{}: {:.2}x",
        names[2],
        store_total.rate() / bare_total.rate()
    );
}

async fn client(config: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(config, NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

/// `conns` tasks reserving a new key and completing it with `result`, for `secs` seconds.
async fn cycles(store: &PgStore, conns: usize, secs: u64, result: &[u8], fp: Fingerprint) -> Cell {
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    timed(conns, secs, |t, stop| {
        let store = store.clone();
        let result = result.to_vec();
        async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let Reservation::Acquired(lease) =
                    store.reserve(&key(run, t, n), fp).await.unwrap()
                else {
                    panic!("not acquired")
                };
                store.complete(&lease, result.clone()).await.unwrap();
                n += 1;
            }
            n
        }
    })
    .await
}

/// The single-key cells: reserve against a bare insert, reserve + complete against a bare
/// insert + update.
async fn single_cells(
    args: &Args,
    store: &PgStore,
    clients: &[Arc<tokio_postgres::Client>],
    body: &[u8],
    result: &[u8],
    fp: Fingerprint,
) {
    let (clients, body, result) = (clients, body, result);
    let bare_insert = move |secs| async move {
        let run = RUN.fetch_add(1, Ordering::Relaxed);
        timed(args.conns, secs, |t, stop| {
            let c = clients[t].clone();
            let body = body.to_vec();
            async move {
                let stmt = c
                    .prepare("INSERT INTO bare (key, body) VALUES ($1, $2) ON CONFLICT DO NOTHING")
                    .await
                    .unwrap();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let k = key(run, t, n);
                    c.execute(&stmt, &[&k.to_string().into_bytes(), &body])
                        .await
                        .unwrap();
                    n += 1;
                }
                n
            }
        })
        .await
    };
    let reserve = move |secs| async move {
        let run = RUN.fetch_add(1, Ordering::Relaxed);
        timed(args.conns, secs, |t, stop| {
            let store = store.clone();
            async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    match store.reserve(&key(run, t, n), fp).await.unwrap() {
                        Reservation::Acquired(_) => {}
                        other => panic!("{other:?}"),
                    }
                    n += 1;
                }
                n
            }
        })
        .await
    };
    pair(
        args.rounds,
        args.secs,
        [
            "bare INSERT ON CONFLICT DO NOTHING",
            "PgStore reserve",
            "reserve / bare",
        ],
        "op",
        bare_insert,
        reserve,
    )
    .await;

    // Insert then update, against reserve then complete.
    let bare_cycle = move |secs| async move {
        let run = RUN.fetch_add(1, Ordering::Relaxed);
        timed(args.conns, secs, |t, stop| {
            let c = clients[t].clone();
            let (body, result) = (body.to_vec(), result.to_vec());
            async move {
                let insert = c
                    .prepare("INSERT INTO bare (key, body) VALUES ($1, $2) ON CONFLICT DO NOTHING")
                    .await
                    .unwrap();
                let update = c
                    .prepare("UPDATE bare SET body = $2 WHERE key = $1")
                    .await
                    .unwrap();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let k = key(run, t, n).to_string().into_bytes();
                    c.execute(&insert, &[&k, &body]).await.unwrap();
                    c.execute(&update, &[&k, &result]).await.unwrap();
                    n += 1;
                }
                n
            }
        })
        .await
    };
    let cycle = move |secs| cycles(store, args.conns, secs, result, fp);
    pair(
        args.rounds,
        args.secs,
        [
            "bare insert + update",
            "PgStore reserve + complete",
            "cycle / bare",
        ],
        "cycle",
        bare_cycle,
        cycle,
    )
    .await;
}

/// The steady state: a retention window, a sweeper, two turnovers, against the empty table,
/// with the table's bytes per live key.
async fn steady_cells(args: &Args, admin: &tokio_postgres::Client, result: &[u8], fp: Fingerprint) {
    // Steady state: a retention window, a sweeper, two turnovers, against the empty table.
    // The empty-table cell on a table of its own: its keys would otherwise add to the first
    // window of the steady table, which would then hold more than one window at its peak, and
    // a table keeps the pages of its peak.
    let steady_store = |table: &'static str| {
        let config = args.config.clone();
        async move {
            PgStore::builder()
                .table(table)
                .pool_size(args.conns + 1)
                .lease(Duration::from_secs(5))
                .retention(Duration::from_secs(args.retention))
                .index_stale(args.index_stale)
                .connect(&config)
                .await
                .expect("connect the steady store")
        }
    };
    let empty_store = steady_store("bench_empty").await;
    let steady = steady_store("bench_steady").await;
    let empty = cycles(&empty_store, args.conns, args.secs, result, fp).await;
    let sweeper = steady.spawn_sweeper(Duration::from_millis(200), 5000);
    // Fill a window, then measure over the next two.
    let _fill = cycles(&steady, args.conns, args.retention, result, fp).await;
    let full = cycles(&steady, args.conns, 2 * args.retention, result, fp).await;
    sweeper.abort();
    let row = admin
        .query_one(
            "SELECT count(*), pg_total_relation_size('bench_steady'), \
             pg_relation_size('bench_steady'), pg_indexes_size('bench_steady') FROM bench_steady",
            &[],
        )
        .await
        .unwrap();
    let (live, total, heap, indexes): (i64, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    // The payload of a live key: its three parts, the fingerprint (32 bytes) and the result.
    let sample = key(0, 0, 1_000_000);
    let payload = sample.to_string().len() + 32 + args.result;
    empty.show("steady: cycle on the empty table", "cycle");
    full.show("steady: cycle at a full window", "cycle");
    println!(
        "steady / empty: {:.2}x; {live} live keys, table {heap} B + indexes {indexes} B \
         (total with TOAST and maps {total} B) = {:.0} B per live key, payload {payload} B: {:.2}x",
        full.rate() / empty.rate(),
        total as f64 / live.max(1) as f64,
        total as f64 / live.max(1) as f64 / payload as f64
    );
    // Where the bytes are (pgstattuple, a contrib module Debian's server package ships): the
    // live rows' own bytes, dead rows and free space, per live key.
    if admin
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        .await
        .is_ok()
    {
        let row = admin
            .query_one(
                "SELECT tuple_count, tuple_len, dead_tuple_len, free_space, table_len \
                 FROM pgstattuple('bench_steady')",
                &[],
            )
            .await
            .unwrap();
        let (count, tuples, dead, free, len): (i64, i64, i64, i64, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
        let per = |bytes: i64| bytes as f64 / count.max(1) as f64;
        println!(
            "bench_steady heap per live row: {:.0} B of which row data {:.0} B, dead rows {:.0} B, \
             free space {:.0} B; indexes {:.0} B",
            per(len),
            per(tuples),
            per(dead),
            per(free),
            per(indexes)
        );
    }
    for table in ["bench_store", "bench_steady"] {
        let row = admin
            .query_one(
                "SELECT n_tup_upd, n_tup_hot_upd, n_dead_tup, n_live_tup, autovacuum_count \
                 FROM pg_stat_user_tables WHERE relname = $1",
                &[&table],
            )
            .await
            .unwrap();
        let (upd, hot, dead, live, vacuums): (i64, i64, i64, i64, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
        println!(
            "{table}: {upd} updates, {hot} HOT ({:.0}%), {dead} dead and {live} live rows, \
             {vacuums} autovacuums",
            hot as f64 * 100.0 / upd.max(1) as f64
        );
    }
}

static RUN: AtomicU64 = AtomicU64::new(0);

fn key(run: u64, task: usize, i: u64) -> Key {
    Key::new("bench", "POST /charges", format!("r{run}-t{task}-{i}")).expect("key")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    SERVER.set(args.server_pid).expect("set once");
    let admin = client(&args.config).await;
    admin
        .batch_execute(
            "DROP TABLE IF EXISTS bare; CREATE TABLE bare (key bytea PRIMARY KEY, \
             body bytea NOT NULL)",
        )
        .await
        .expect("bare table");
    for table in ["bench_store", "bench_empty", "bench_steady"] {
        admin
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {table}, {table}_meta; DROP SEQUENCE IF EXISTS {table}_tokens"
            ))
            .await
            .expect("drop");
    }
    let store = PgStore::builder()
        .table("bench_store")
        .pool_size(args.conns)
        .index_stale(args.index_stale)
        .connect(&args.config)
        .await
        .expect("connect the store");
    let result = vec![7u8; args.result];
    let body = vec![1u8; 60];
    let fp = Fingerprint::of(b"amount=100");
    println!("load average before: {}", load());

    // Bare INSERT ... ON CONFLICT DO NOTHING, one client per task.
    let mut clients = Vec::new();
    for _ in 0..args.conns {
        clients.push(Arc::new(client(&args.config).await));
    }
    if !args.batch_only {
        single_cells(&args, &store, &clients, &body, &result, fp).await;
    }
    // Batches of 1000 new keys.
    let batch_tasks = 4.min(args.conns);
    let (clients_ref, body_ref, store_ref) = (&clients, &body, &store);
    let bare_batch = move |secs| async move {
        let run = RUN.fetch_add(1, Ordering::Relaxed);
        timed(batch_tasks, secs, |t, stop| {
            let c = clients_ref[t].clone();
            let body = body_ref.clone();
            async move {
                let stmt = c
                    .prepare(
                        "INSERT INTO bare (key, body) SELECT * FROM unnest($1::bytea[], $2::bytea[]) \
                         ON CONFLICT DO NOTHING",
                    )
                    .await
                    .unwrap();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let keys: Vec<Vec<u8>> = (0..1000)
                        .map(|i| key(run, t, n + i).to_string().into_bytes())
                        .collect();
                    let bodies = vec![body.clone(); 1000];
                    c.execute(&stmt, &[&keys, &bodies]).await.unwrap();
                    n += 1000;
                }
                n
            }
        })
        .await
    };
    let batch = move |secs| async move {
        let run = RUN.fetch_add(1, Ordering::Relaxed);
        timed(batch_tasks, secs, |t, stop| {
            let store = store_ref.clone();
            async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let items: Vec<(Key, Fingerprint)> =
                        (0..1000).map(|i| (key(run, t, n + i), fp)).collect();
                    for r in store.reserve_many(&items).await.unwrap() {
                        assert!(matches!(r, Ok(Reservation::Acquired(_))));
                    }
                    n += 1000;
                }
                n
            }
        })
        .await
    };
    pair(
        args.rounds,
        args.secs,
        [
            "bare multi-row insert (1000)",
            "PgStore reserve_many (1000)",
            "batch / bare",
        ],
        "key",
        bare_batch,
        batch,
    )
    .await;

    if !args.batch_only && !args.skip_steady {
        steady_cells(&args, &admin, &result, fp).await;
    }
    println!("load average after: {}", load());
}
