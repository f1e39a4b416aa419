//! The `idemstore` command line against a store in a PostgreSQL table (`--postgres`,
//! `--table`), checked against what `PgStore` itself answers; the snapshot that `stats`,
//! `list` and `get` read (one read-only transaction, whatever is written meanwhile); and an
//! unreachable server, which is a clear error naming it, not a hang. The server is the
//! library suite's throwaway one (`tests/postgres/server.rs`).
//!
//! The command line reads the system clock, so the fixture is written through a
//! [`ManualClock`] set in the past: a reservation made "two hours ago" with a one-hour lease is
//! stale now.

use std::time::{Duration, Instant, SystemTime};

use idemstore::{
    Fingerprint, Key, ManualClock, PgStore, Record, RecordClass, Reservation, ScanFilter, Status,
};
use serde_json::Value;

use crate::common::{fp, key};
use crate::run::{fill, ids, run, run_json, runtime, HOUR};
use crate::server::Server;

/// One record in each state in `table` ([`fill`]); returns a store on the system clock, as
/// the command line reads.
async fn fixture(server: &Server, table: &str) -> PgStore {
    let clock = ManualClock::new();
    let store = PgStore::builder()
        .table(table)
        .lease(HOUR)
        .retention(24 * HOUR)
        .clock(clock.clone())
        .connect(&server.config())
        .await
        .expect("connect to the test server");
    fill(&store, &clock).await;
    PgStore::builder()
        .table(table)
        .lease(HOUR)
        .connect(&server.config())
        .await
        .unwrap()
}

/// Runs `idemstore --postgres CONFIG --table TABLE REST...`.
struct On<'a> {
    config: &'a str,
    table: &'a str,
}

impl On<'_> {
    #[track_caller]
    fn run(&self, rest: &[&str], code: i32) -> (String, String) {
        let mut args = vec!["--postgres", self.config, "--table", self.table];
        args.extend_from_slice(rest);
        run(&args, code)
    }

    #[track_caller]
    fn json(&self, rest: &[&str], code: i32) -> Value {
        let mut args = vec!["--postgres", self.config, "--table", self.table, "--json"];
        args.extend_from_slice(rest);
        run_json(&args, code)
    }
}

/// Every test of the command line on PostgreSQL shares one server, each on its own table.
#[test]
fn cli_on_postgres() {
    let server = Server::start();
    let rt = runtime();
    let config = server.config();
    read_commands_answer_as_the_store_does(&rt, &server, &config);
    expire_and_resolve_change_the_table(&rt, &server, &config);
    rt.block_on(a_snapshot_reads_one_moment_whatever_is_written_after(
        &server,
    ));
    an_unreachable_server_is_an_error_naming_it();
}

fn read_commands_answer_as_the_store_does(
    rt: &tokio::runtime::Runtime,
    server: &Server,
    config: &str,
) {
    let on = On {
        config,
        table: "cli_read",
    };
    let store = rt.block_on(fixture(server, on.table));

    // stats: the counts of the fixture and the oldest reservation.
    let stats = on.json(&["stats"], 0);
    let counts = &stats["counts"];
    for (state, n) in [
        ("pending", 1),
        ("stale", 1),
        ("needs_review", 1),
        ("completed", 1),
        ("expired", 1),
        ("damaged", 0),
        ("total", 5),
    ] {
        assert_eq!(counts[state], n, "{state} in {stats:#}");
    }
    assert_eq!(stats["table"], "cli_read");
    assert!(
        stats["postgres"].as_str().unwrap().contains("127.0.0.1"),
        "{stats:#}"
    );
    assert_eq!(stats["oldest_pending"]["id"], "stale", "{stats:#}");
    let (text, _) = on.run(&["stats"], 0);
    for line in [
        "database",
        "table",
        "stale (lease ended)",
        "total",
        "oldest pending: u1/charge/stale",
    ] {
        assert!(text.contains(line), "{line:?} missing in:\n{text}");
    }
    // A table with nothing in it: an empty store, not an error.
    let empty = On {
        config,
        table: "cli_nothing",
    };
    assert_eq!(empty.json(&["stats"], 0)["counts"]["total"], 0);

    // list: every record in key order (each part behind its length), each state alone.
    let all = on.json(&["list"], 0);
    assert_eq!(
        ids(&all["records"]),
        ["done", "live", "stale", "review", "old"]
    );
    assert_eq!(all["truncated"], false);
    for (state, want) in [
        ("stale", "stale"),
        ("pending", "live"),
        ("expired", "old"),
        ("completed", "done"),
        ("needs-review", "review"),
    ] {
        let listed = on.json(&["list", "--state", state], 0);
        assert_eq!(ids(&listed["records"]), [want], "--state {state}");
        assert_eq!(listed["records"][0]["state"], state);
    }
    let stale_by_store = rt.block_on(store.stale(100)).unwrap();
    assert_eq!(stale_by_store.len(), 1);
    assert_eq!(stale_by_store[0].0.id(), b"stale");
    let old_stale = on.json(&["list", "--state", "stale", "--older-than", "30m"], 0);
    assert_eq!(ids(&old_stale["records"]), ["stale"]);
    let older = on.json(&["list", "--state", "stale", "--older-than", "90m"], 0);
    assert_eq!(ids(&older["records"]), Vec::<&str>::new());
    let limited = on.json(&["list", "--limit", "2"], 0);
    assert_eq!(ids(&limited["records"]), ["done", "live"]);
    assert_eq!(limited["truncated"], true);

    // get: the record the store returns, field by field.
    for id in ["live", "stale", "review", "done"] {
        let shown = on.json(&["get", "u1", "charge", id], 0);
        let record: Record = rt
            .block_on(store.get(&key("u1", "charge", id)))
            .unwrap()
            .unwrap();
        assert_eq!(shown["token"], record.token(), "{id}: {shown:#}");
        assert_eq!(shown["attempt"], record.attempt(), "{id}");
        assert_eq!(shown["id"], id);
    }
    let done = on.json(&["get", "u1", "charge", "done"], 0);
    assert_eq!(done["state"], "completed");
    assert_eq!(done["result"], "201 created");
    let (raw, _) = on.run(&["get", "--raw", "u1", "charge", "done"], 0);
    assert_eq!(raw, "201 created");
    assert_eq!(
        on.json(&["get", "u1", "charge", "review"], 0)["note"],
        "gateway timed out"
    );
    // Expired reads as absent, as from the store.
    let (_, err) = on.run(&["get", "u2", "refund", "old"], 1);
    assert!(err.contains("no record for key u2/refund/old"), "{err}");
    // A store file with --postgres, a key of two parts, a file-only command: usage errors.
    on.run(&["get", "x.idem", "u1", "charge", "done"], 2);
    on.run(&["get", "u1", "charge"], 2);
    on.run(&["stats", "x.idem"], 2);
    let (_, err) = on.run(&["sweep", "x.idem"], 2);
    assert!(
        err.contains("--postgres works with stats, list, get, expire and resolve"),
        "{err}"
    );
    let (_, err) = run(&["--table", "cli_read", "stats", "x.idem"], 2);
    assert!(err.contains("give --postgres too"), "{err}");
}

fn expire_and_resolve_change_the_table(
    rt: &tokio::runtime::Runtime,
    server: &Server,
    config: &str,
) {
    let on = On {
        config,
        table: "cli_write",
    };
    let store = rt.block_on(fixture(server, on.table));
    let get = |id: &str| {
        rt.block_on(store.get(&key("u1", "charge", id)))
            .unwrap()
            .map(|record| match record.status() {
                Status::Completed { result, .. } => {
                    format!("completed {}", String::from_utf8_lossy(result))
                }
                Status::Pending { .. } => "pending".to_string(),
                Status::NeedsReview { .. } => "needs-review".to_string(),
                _ => "other".to_string(),
            })
    };

    // resolve --complete: the review key now replays the given result.
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("result.bin");
    std::fs::write(&result, b"200 settled").unwrap();
    let path = result.to_str().unwrap();
    let resolved = on.json(
        &["resolve", "u1", "charge", "review", "--complete", path],
        0,
    );
    assert_eq!(resolved["was"], "needs-review", "{resolved:#}");
    assert_eq!(get("review").as_deref(), Some("completed 200 settled"));
    // resolve --release: the stale key is gone; a completed key is refused.
    let (out, _) = on.run(&["resolve", "u1", "charge", "stale", "--release"], 0);
    assert!(out.contains("(was stale): released"), "{out}");
    assert_eq!(get("stale"), None);
    let (_, err) = on.run(&["resolve", "u1", "charge", "done", "--release"], 1);
    assert!(err.contains("u1/charge/done"), "{err}");
    assert!(get("done").is_some());

    // expire: a live lease needs --force; then the key is gone from the table.
    let (_, err) = on.run(&["expire", "u1", "charge", "live"], 1);
    assert!(err.contains("--force"), "{err}");
    assert_eq!(get("live").as_deref(), Some("pending"));
    let expired = on.json(&["expire", "u1", "charge", "live", "--force"], 0);
    assert_eq!(expired["was"], "pending", "{expired:#}");
    assert_eq!(get("live"), None);
    let (out, _) = on.run(&["expire", "u1", "charge", "done"], 0);
    assert!(
        out.contains("expired u1/charge/done (was completed)"),
        "{out}"
    );
    assert_eq!(get("done"), None);
    let (out, _) = on.run(&["expire", "u1", "charge", "done"], 0);
    assert!(out.contains("nothing stored for u1/charge/done"), "{out}");
    // What is left: the review key, completed, and the expired old one.
    let stats = on.json(&["stats"], 0);
    assert_eq!(stats["counts"]["completed"], 1, "{stats:#}");
    assert_eq!(stats["counts"]["expired"], 1, "{stats:#}");
    assert_eq!(stats["counts"]["total"], 2, "{stats:#}");
}

async fn a_snapshot_reads_one_moment_whatever_is_written_after(server: &Server) {
    let store = fixture(server, "cli_snapshot").await;
    let snapshot = store.snapshot().await.unwrap();
    let before = snapshot.counts().await.unwrap();
    let listed = snapshot.scan(&ScanFilter::any(), 100).await.unwrap();
    assert_eq!((before.total(), listed.len()), (5, 5));

    // Enough new keys for several pages, in front of and behind the fixture's keys.
    for scope in ["a0", "zz"] {
        let items: Vec<(Key, Fingerprint)> = (0..600)
            .map(|i| (key(scope, "charge", &format!("k{i:03}")), fp("n")))
            .collect();
        for answer in store.reserve_many(&items).await.unwrap() {
            assert!(matches!(answer.unwrap(), Reservation::Acquired(_)));
        }
    }
    store.expire(&key("u1", "charge", "done")).await.unwrap();
    let review = key("u1", "charge", "review");
    store
        .resolve(&review, idemstore::Resolution::Release)
        .await
        .unwrap();

    assert_eq!(snapshot.counts().await.unwrap(), before);
    let again = snapshot.scan(&ScanFilter::any(), 10_000).await.unwrap();
    assert_eq!(
        again.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
        listed.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>()
    );
    assert!(snapshot.get(&review).await.unwrap().is_some());
    assert!(snapshot
        .get(&key("a0", "charge", "k000"))
        .await
        .unwrap()
        .is_none());

    let now = store.snapshot().await.unwrap();
    let after = now.counts().await.unwrap();
    assert_eq!(after.pending, 1201, "{after:?}");
    assert_eq!(after.total(), 5 - 2 + 1200, "{after:?}");
    let pending = now
        .scan(&ScanFilter::of(RecordClass::Pending), 2000)
        .await
        .unwrap();
    assert_eq!(pending.len(), 1201);
    // Oldest lease first, as the local store lists reservations.
    let deadlines: Vec<SystemTime> = pending
        .iter()
        .map(|(_, record)| match record.status() {
            Status::Pending { lease_until, .. } => lease_until,
            other => panic!("a pending listing holds {other:?}"),
        })
        .collect();
    assert!(
        deadlines.windows(2).all(|w| w[0] <= w[1]),
        "pending records not listed by lease deadline"
    );
}

fn an_unreachable_server_is_an_error_naming_it() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let config = format!("host=127.0.0.1 port={port} user=postgres connect_timeout=2");
    let started = Instant::now();
    let (_, err) = run(&["--postgres", &config, "stats"], 1);
    let took = started.elapsed();
    assert!(
        err.contains(&format!(
            "connecting to table `idemstore` on PostgreSQL at 127.0.0.1 port {port}"
        )) && err.contains("PostgreSQL error while connecting"),
        "{err}"
    );
    assert!(!err.contains("cluster"), "{err}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
}
