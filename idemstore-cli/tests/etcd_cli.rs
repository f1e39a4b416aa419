//! The `idemstore` command line against a store on a 3-member cluster (`--etcd`,
//! `--etcd-config`), checked against what `EtcdStore` itself answers; the snapshot that
//! `stats`, `list` and `get` read (one revision, whatever is written meanwhile); and an
//! unreachable cluster, which is a clear error naming the endpoint, not a hang.
//!
//! The command line reads the system clock, so the fixture is written through a
//! [`ManualClock`] set in the past: a reservation made "two hours ago" with a one-hour lease is
//! stale now.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use idemstore::etcd_client::{Client, GetOptions};
use idemstore::{
    Error, EtcdStore, Fingerprint, Key, ManualClock, Record, RecordClass, Reservation, ScanFilter,
    Status,
};
use serde_json::Value;

use crate::cluster::Cluster;
use crate::common::{encoded, fp, key};
use crate::run::{acquire, fill, ids, run, run_json, runtime, HOUR};

async fn store(cluster: &Cluster, prefix: &str, clock: &ManualClock) -> EtcdStore {
    EtcdStore::builder()
        .prefix(prefix)
        .lease(HOUR)
        .retention(24 * HOUR)
        .clock(clock.clone())
        .connect(&cluster.endpoints())
        .await
        .expect("connect to the test cluster")
}

/// One record in each state under `prefix` ([`fill`]); returns a store on the system clock, as
/// the command line reads.
async fn fixture(cluster: &Cluster, prefix: &str) -> EtcdStore {
    let clock = ManualClock::new();
    let store = store(cluster, prefix, &clock).await;
    fill(&store, &clock).await;
    // The checks below read with the system clock, as the command line does.
    EtcdStore::builder()
        .prefix(prefix)
        .lease(HOUR)
        .connect(&cluster.endpoints())
        .await
        .unwrap()
}

/// `--etcd ENDPOINTS --prefix P` and the rest of the arguments.
fn on(cluster: &str, prefix: &str, rest: &[&str]) -> Vec<String> {
    ["--etcd", cluster, "--prefix", prefix]
        .iter()
        .chain(rest)
        .map(|s| s.to_string())
        .collect()
}

fn args(owned: &[String]) -> Vec<&str> {
    owned.iter().map(String::as_str).collect()
}

/// Every test of the command line on a cluster shares one, each under its own prefix.
#[test]
fn cli_on_a_cluster() {
    let cluster = Cluster::start();
    let rt = runtime();
    let endpoints = cluster.endpoints().join(",");
    read_commands_answer_as_the_store_does(&rt, &cluster, &endpoints);
    expire_and_resolve_change_the_cluster(&rt, &cluster, &endpoints);
    a_config_file_names_the_cluster(&rt, &cluster);
    rt.block_on(a_snapshot_reads_one_revision_whatever_is_written_after(
        &cluster,
    ));
    stats_under_writes_counts_one_revision(&rt, &cluster, &endpoints);
    damaged_values_are_counted_and_named(&rt, &cluster, &endpoints);
    large_results_are_read_in_smaller_pages(&rt, &cluster, &endpoints);
    an_unreachable_cluster_is_an_error_naming_it(&cluster);
}

fn read_commands_answer_as_the_store_does(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    endpoints: &str,
) {
    let prefix = "cli-read/";
    let store = rt.block_on(fixture(cluster, prefix));

    // stats: the counts of the fixture, at a revision, and the oldest reservation.
    let stats = run_json(&args(&on(endpoints, prefix, &["--json", "stats"])), 0);
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
    assert!(stats["revision"].as_i64().unwrap() > 0, "{stats:#}");
    assert_eq!(stats["prefix"], prefix);
    assert_eq!(stats["oldest_pending"]["id"], "stale", "{stats:#}");
    let (text, _) = run(&args(&on(endpoints, prefix, &["stats"])), 0);
    for line in [
        "etcd cluster",
        "prefix",
        "stale (lease ended)",
        "total",
        "oldest pending: u1/charge/stale",
    ] {
        assert!(text.contains(line), "{line:?} missing in:\n{text}");
    }
    // A prefix with nothing under it: an empty store, not an error.
    let empty = run_json(&args(&on(endpoints, "nothing/", &["--json", "stats"])), 0);
    assert_eq!(empty["counts"]["total"], 0, "{empty:#}");

    // list: every record in key order (each part behind its length, so "stale" before
    // "review"), each state through its index, as the store lists.
    let all = run_json(&args(&on(endpoints, prefix, &["--json", "list"])), 0);
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
        let listed = run_json(
            &args(&on(
                endpoints,
                prefix,
                &["--json", "list", "--state", state],
            )),
            0,
        );
        assert_eq!(ids(&listed["records"]), [want], "--state {state}");
        assert_eq!(listed["records"][0]["state"], state);
    }
    let stale_by_store = rt.block_on(store.stale(100)).unwrap();
    assert_eq!(stale_by_store.len(), 1);
    assert_eq!(stale_by_store[0].0.id(), b"stale");
    let old_stale = run_json(
        &args(&on(
            endpoints,
            prefix,
            &["--json", "list", "--state", "stale", "--older-than", "30m"],
        )),
        0,
    );
    assert_eq!(ids(&old_stale["records"]), ["stale"]);
    let older = run_json(
        &args(&on(
            endpoints,
            prefix,
            &["--json", "list", "--state", "stale", "--older-than", "90m"],
        )),
        0,
    );
    assert_eq!(ids(&older["records"]), Vec::<&str>::new());
    let limited = run_json(
        &args(&on(endpoints, prefix, &["--json", "list", "--limit", "2"])),
        0,
    );
    assert_eq!(ids(&limited["records"]), ["done", "live"]);
    assert_eq!(limited["truncated"], true);
    let (table, _) = run(&args(&on(endpoints, prefix, &["list"])), 0);
    assert!(
        table.starts_with("SCOPE") && table.contains("refund") && table.contains("stale for"),
        "{table}"
    );

    // get: the record the store returns, field by field.
    for id in ["live", "stale", "review", "done"] {
        let shown = run_json(
            &args(&on(
                endpoints,
                prefix,
                &["--json", "get", "u1", "charge", id],
            )),
            0,
        );
        let record: Record = rt
            .block_on(store.get(&key("u1", "charge", id)))
            .unwrap()
            .unwrap();
        assert_eq!(shown["token"], record.token(), "{id}: {shown:#}");
        assert_eq!(shown["attempt"], record.attempt(), "{id}");
        assert_eq!(shown["id"], id);
    }
    let done = run_json(
        &args(&on(
            endpoints,
            prefix,
            &["--json", "get", "u1", "charge", "done"],
        )),
        0,
    );
    assert_eq!(done["state"], "completed");
    assert_eq!(done["result"], "201 created");
    let (raw, _) = run(
        &args(&on(
            endpoints,
            prefix,
            &["get", "--raw", "u1", "charge", "done"],
        )),
        0,
    );
    assert_eq!(raw, "201 created");
    let review = run_json(
        &args(&on(
            endpoints,
            prefix,
            &["--json", "get", "u1", "charge", "review"],
        )),
        0,
    );
    assert_eq!(review["note"], "gateway timed out");
    // Expired reads as absent, as from the store.
    assert!(rt
        .block_on(store.get(&key("u2", "refund", "old")))
        .unwrap()
        .is_none());
    let (_, err) = run(
        &args(&on(endpoints, prefix, &["get", "u2", "refund", "old"])),
        1,
    );
    assert!(err.contains("no record for key u2/refund/old"), "{err}");
    // A store file with --etcd, or a key of two parts, is a usage error.
    run(
        &args(&on(
            endpoints,
            prefix,
            &["get", "x.idem", "u1", "charge", "done"],
        )),
        2,
    );
    run(&args(&on(endpoints, prefix, &["get", "u1", "charge"])), 2);
    run(&args(&on(endpoints, prefix, &["stats", "x.idem"])), 2);
    let (_, err) = run(&args(&on(endpoints, prefix, &["sweep", "x.idem"])), 2);
    assert!(
        err.contains("stats, list, get, expire and resolve"),
        "{err}"
    );
}

fn expire_and_resolve_change_the_cluster(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    endpoints: &str,
) {
    let prefix = "cli-write/";
    let store = rt.block_on(fixture(cluster, prefix));
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
    let resolved = run_json(
        &args(&on(
            endpoints,
            prefix,
            &[
                "--json",
                "resolve",
                "u1",
                "charge",
                "review",
                "--complete",
                result.to_str().unwrap(),
            ],
        )),
        0,
    );
    assert_eq!(resolved["was"], "needs-review", "{resolved:#}");
    assert_eq!(get("review").as_deref(), Some("completed 200 settled"));
    // resolve --release: the stale key is gone; a live or completed key is refused.
    let (out, _) = run(
        &args(&on(
            endpoints,
            prefix,
            &["resolve", "u1", "charge", "stale", "--release"],
        )),
        0,
    );
    assert!(out.contains("(was stale): released"), "{out}");
    assert_eq!(get("stale"), None);
    let (_, err) = run(
        &args(&on(
            endpoints,
            prefix,
            &["resolve", "u1", "charge", "done", "--release"],
        )),
        1,
    );
    assert!(err.contains("u1/charge/done"), "{err}");
    assert!(get("done").is_some());

    // expire: a live lease needs --force; then the key is gone from the cluster.
    let (_, err) = run(
        &args(&on(endpoints, prefix, &["expire", "u1", "charge", "live"])),
        1,
    );
    assert!(err.contains("--force"), "{err}");
    assert_eq!(get("live").as_deref(), Some("pending"));
    let expired = run_json(
        &args(&on(
            endpoints,
            prefix,
            &["--json", "expire", "u1", "charge", "live", "--force"],
        )),
        0,
    );
    assert_eq!(expired["was"], "pending", "{expired:#}");
    assert_eq!(get("live"), None);
    let (out, _) = run(
        &args(&on(endpoints, prefix, &["expire", "u1", "charge", "done"])),
        0,
    );
    assert!(
        out.contains("expired u1/charge/done (was completed)"),
        "{out}"
    );
    assert_eq!(get("done"), None);
    let (out, _) = run(
        &args(&on(endpoints, prefix, &["expire", "u1", "charge", "done"])),
        0,
    );
    assert!(out.contains("nothing stored for u1/charge/done"), "{out}");
    // What is left: the review key, completed, and the expired old one.
    let stats = run_json(&args(&on(endpoints, prefix, &["--json", "stats"])), 0);
    assert_eq!(stats["counts"]["completed"], 1, "{stats:#}");
    assert_eq!(stats["counts"]["expired"], 1, "{stats:#}");
    assert_eq!(stats["counts"]["total"], 2, "{stats:#}");
}

fn a_config_file_names_the_cluster(rt: &tokio::runtime::Runtime, cluster: &Cluster) {
    let prefix = "cli-config/";
    rt.block_on(fixture(cluster, prefix));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("etcd.json");
    let value = serde_json::json!({ "endpoints": cluster.endpoints(), "prefix": prefix });
    std::fs::write(&config, value.to_string()).unwrap();
    let path = config.to_str().unwrap();
    let stats = run_json(&["--etcd-config", path, "--json", "stats"], 0);
    assert_eq!(stats["counts"]["total"], 5, "{stats:#}");
    assert_eq!(stats["prefix"], prefix);
    // --prefix overrides the file's.
    let other = run_json(
        &[
            "--etcd-config",
            path,
            "--prefix",
            "nothing/",
            "--json",
            "stats",
        ],
        0,
    );
    assert_eq!(other["counts"]["total"], 0, "{other:#}");
    // A field the tool does not know is named, with the file.
    std::fs::write(&config, r#"{"endpoint": ["127.0.0.1:2379"]}"#).unwrap();
    let (_, err) = run(&["--etcd-config", path, "stats"], 1);
    assert!(
        err.contains("unknown field \"endpoint\"") && err.contains("etcd.json"),
        "{err}"
    );
    std::fs::write(&config, "endpoints = [\"127.0.0.1:2379\"]").unwrap();
    let (_, err) = run(&["--etcd-config", path, "stats"], 1);
    assert!(
        err.contains("not JSON") && err.contains("etcd.json"),
        "{err}"
    );
}

/// The reads of a snapshot carry its first read's revision: keys written, completed and
/// expired after it was taken change none of its answers; a new snapshot sees them.
async fn a_snapshot_reads_one_revision_whatever_is_written_after(cluster: &Cluster) {
    let prefix = "cli-snapshot/";
    let store = fixture(cluster, prefix).await;
    let snapshot = store.snapshot().await.unwrap();
    let before = snapshot.counts().await.unwrap();
    let listed = snapshot.scan(&ScanFilter::any(), 100).await.unwrap();
    assert_eq!((before.total(), listed.len()), (5, 5));

    // Enough new keys for several pages of the records' range, in front of and behind
    // the fixture's keys.
    for scope in ["a0", "zz"] {
        let items: Vec<(Key, Fingerprint)> = (0..300)
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
    let stale = key("u1", "charge", "stale");
    store
        .resolve(&stale, idemstore::Resolution::Release)
        .await
        .unwrap();

    assert_eq!(snapshot.counts().await.unwrap(), before);
    let again = snapshot.scan(&ScanFilter::any(), 1000).await.unwrap();
    assert_eq!(
        again.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
        listed.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>()
    );
    let pending = snapshot
        .scan(&ScanFilter::of(RecordClass::Pending), 1000)
        .await
        .unwrap();
    assert_eq!(pending.len(), 1, "only the fixture's live key");
    // Listed by lease deadline, and read at the snapshot's revision too.
    let stale_then = snapshot
        .scan(&ScanFilter::of(RecordClass::Stale), 10)
        .await
        .unwrap();
    let stale_keys: Vec<Key> = stale_then.into_iter().map(|(k, _)| k).collect();
    assert_eq!(stale_keys, std::slice::from_ref(&stale));
    assert!(snapshot.get(&review).await.unwrap().is_some());
    assert!(snapshot
        .get(&key("a0", "charge", "k000"))
        .await
        .unwrap()
        .is_none());

    let now = store.snapshot().await.unwrap();
    assert!(now.revision() > snapshot.revision());
    let after = now.counts().await.unwrap();
    assert_eq!(after.pending, 601, "{after:?}");
    assert_eq!((after.stale, after.total()), (0, 5 - 3 + 600), "{after:?}");
    assert!(now.get(&review).await.unwrap().is_none());
    let pending = now
        .scan(&ScanFilter::of(RecordClass::Pending), 1000)
        .await
        .unwrap();
    assert_eq!(pending.len(), 601);
    // Oldest lease first, as the local store lists reservations.
    let deadlines: Vec<SystemTime> = pending
        .iter()
        .map(|(_, record)| match record.status() {
            idemstore::Status::Pending { lease_until, .. } => lease_until,
            other => panic!("a pending listing holds {other:?}"),
        })
        .collect();
    assert!(
        deadlines.windows(2).all(|w| w[0] <= w[1]),
        "pending records not listed by lease deadline: {:?} ...",
        &deadlines[..deadlines.len().min(8)]
    );
    let first = now
        .scan(&ScanFilter::of(RecordClass::Pending), 1)
        .await
        .unwrap();
    assert_eq!(first[0].0, pending[0].0, "a limit keeps the oldest leases");

    // Compacted past its revision, the old snapshot is an error saying so, at once.
    let mut client = Client::connect(cluster.endpoints(), None).await.unwrap();
    client.compact(now.revision(), None).await.unwrap();
    let started = Instant::now();
    let error = snapshot.counts().await.unwrap_err();
    assert!(
        matches!(error, Error::Cluster { .. })
            && error
                .to_string()
                .contains(&format!("compacted past revision {}", snapshot.revision())),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(now.counts().await.unwrap(), after);
}

/// A record value that does not decode, and an etcd key under the records that is no key:
/// counted as damaged, skipped by `list`, and `get` names the key and the damage.
fn damaged_values_are_counted_and_named(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    endpoints: &str,
) {
    let prefix = "cli-damage/";
    rt.block_on(async {
        fixture(cluster, prefix).await;
        let mut client = Client::connect(cluster.endpoints(), None).await.unwrap();
        let mut record = prefix.as_bytes().to_vec();
        record.extend_from_slice(b"r/");
        record.extend_from_slice(&encoded(&key("u1", "charge", "done")));
        client
            .put(record, b"\x01garbage".to_vec(), None)
            .await
            .unwrap();
        client
            .put(format!("{prefix}r/not-a-key"), b"\x01x".to_vec(), None)
            .await
            .unwrap();
    });
    let stats = run_json(&args(&on(endpoints, prefix, &["--json", "stats"])), 0);
    assert_eq!(stats["counts"]["damaged"], 2, "{stats:#}");
    assert_eq!(stats["counts"]["completed"], 0, "{stats:#}");
    assert_eq!(stats["counts"]["total"], 6, "{stats:#}");
    let (text, _) = run(&args(&on(endpoints, prefix, &["stats"])), 0);
    assert!(text.contains("damaged (`get` shows why)"), "{text}");
    let listed = run_json(&args(&on(endpoints, prefix, &["--json", "list"])), 0);
    assert_eq!(ids(&listed["records"]), ["live", "stale", "review", "old"]);
    let (_, err) = run(
        &args(&on(endpoints, prefix, &["get", "u1", "charge", "done"])),
        1,
    );
    assert!(
        err.contains("corruption detected in etcd record of key u1/charge/done"),
        "{err}"
    );
}

/// `stats` while writers add and complete keys: its counts are those of the revision it
/// reports, as etcd itself counts the record keys at that revision.
fn stats_under_writes_counts_one_revision(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    endpoints: &str,
) {
    let prefix = "cli-busy/";
    let store = rt.block_on(fixture(cluster, prefix));
    // Several pages of records before the writers start.
    rt.block_on(async {
        let items: Vec<(Key, Fingerprint)> = (0..700)
            .map(|i| (key("m", "charge", &format!("k{i:04}")), fp("n")))
            .collect();
        store.reserve_many(&items).await.unwrap();
    });
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (store, stop) = (store.clone(), stop.clone());
            rt.spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    // Spread over the key order, so new keys land in pages not read yet.
                    let k = key(["a", "m", "n", "z"][w], "op", &format!("w{n}"));
                    if let Reservation::Acquired(lease) = store.reserve(&k, fp("w")).await.unwrap()
                    {
                        if n % 2 == 0 {
                            store.complete(&lease, b"ok".to_vec()).await.unwrap();
                        }
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut client = rt
        .block_on(Client::connect(cluster.endpoints(), None))
        .unwrap();
    let mut revisions = Vec::new();
    for _ in 0..3 {
        let stats = run_json(&args(&on(endpoints, prefix, &["--json", "stats"])), 0);
        let revision = stats["revision"].as_i64().unwrap();
        let count = |client: &mut Client, kind: &str| {
            let options = GetOptions::new()
                .with_prefix()
                .with_count_only()
                .with_revision(revision);
            rt.block_on(client.get(format!("{prefix}{kind}"), Some(options)))
                .unwrap()
                .count()
        };
        let counts = &stats["counts"];
        let records = count(&mut client, "r/");
        assert_eq!(
            counts["total"].as_i64(),
            Some(records),
            "at revision {revision}: {stats:#}"
        );
        revisions.push(revision);
    }
    stop.store(true, Ordering::Relaxed);
    let written: u64 = writers.into_iter().map(|w| rt.block_on(w).unwrap()).sum();
    assert!(written > 0);
    assert!(
        revisions.windows(2).all(|w| w[0] < w[1]),
        "the writers moved the revision between the runs: {revisions:?}"
    );
}

/// Twenty results of 1 MiB: more than one answer may hold (16 MiB), so the pages of the
/// records' range and the reads of the records an index names are split until they fit.
fn large_results_are_read_in_smaller_pages(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    endpoints: &str,
) {
    let prefix = "cli-large/";
    let result = vec![b'x'; 1 << 20];
    rt.block_on(async {
        let clock = ManualClock::new();
        let store = store(cluster, prefix, &clock).await;
        // Completed two days ago: expired, so `list --state expired` sorts them by expiry.
        clock.set(SystemTime::now() - 48 * HOUR);
        for i in 0..20 {
            let lease = acquire(&store, &key("big", "op", &format!("k{i:02}")), fp("b")).await;
            store.complete(&lease, result.clone()).await.unwrap();
        }
    });
    let stats = run_json(&args(&on(endpoints, prefix, &["--json", "stats"])), 0);
    assert_eq!(stats["counts"]["expired"], 20, "{stats:#}");
    let listed = run_json(
        &args(&on(
            endpoints,
            prefix,
            &["--json", "list", "--state", "expired"],
        )),
        0,
    );
    assert_eq!(listed["records"].as_array().unwrap().len(), 20);
    assert!(listed["records"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["result_len"] == 1 << 20));
    let all = run_json(&args(&on(endpoints, prefix, &["--json", "list"])), 0);
    assert_eq!(all["records"].as_array().unwrap().len(), 20);
}

/// An endpoint nobody listens on: an error naming it within the timeout, exit 1; a good
/// member beside it is enough.
fn an_unreachable_cluster_is_an_error_naming_it(cluster: &Cluster) {
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let started = Instant::now();
    let (_, err) = run(&["--etcd", &dead, "--etcd-timeout", "2s", "stats"], 1);
    let took = started.elapsed();
    assert!(
        err.contains(&format!("no answer from the etcd cluster at {dead}")) && err.contains("2s"),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let (_, err) = run(
        &[
            "--etcd",
            &dead,
            "--etcd-timeout",
            "1s",
            "--json",
            "get",
            "a",
            "b",
            "c",
        ],
        1,
    );
    let value: Value = serde_json::from_str(&err).unwrap();
    assert!(value["error"].as_str().unwrap().contains(&dead), "{err}");
    // With one live member among the endpoints, the command works.
    let mixed = format!("{dead},{}", cluster.endpoints()[0]);
    let stats = run_json(
        &["--etcd", &mixed, "--prefix", "cli-read/", "--json", "stats"],
        0,
    );
    assert!(stats["revision"].as_i64().unwrap() > 0, "{stats:#}");
}
