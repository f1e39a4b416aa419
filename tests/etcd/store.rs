//! What only the etcd store has: `complete_with` on etcd operations, batching within
//! `--max-txn-ops`, the index, the background sweeper, expire's index entries, damaged
//! values, the layout version, settings, and the message when the `etcd` binary is missing.

use std::time::{Duration, Instant};

use idemstore::etcd_client::{Client, GetOptions, TxnOp};
use idemstore::{
    Error, EtcdStore, Fingerprint, Key, LeaseLostReason, ManualClock, RecordClass, Reservation,
};

use super::cluster::Cluster;
use crate::common::{encoded, fp, key, Env, LEASE, RETENTION};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn store(
    cluster: &Cluster,
    prefix: &str,
    clock: &ManualClock,
    max_txn_ops: usize,
) -> EtcdStore {
    EtcdStore::builder()
        .prefix(prefix)
        .lease(LEASE)
        .retention(RETENTION)
        .max_txn_ops(max_txn_ops)
        .clock(clock.clone())
        .connect(&cluster.endpoints())
        .await
        .expect("connect to the test cluster")
}

async fn count(client: &mut Client, prefix: &str) -> i64 {
    let options = GetOptions::new().with_prefix().with_count_only();
    client.get(prefix, Some(options)).await.unwrap().count()
}

async fn acquire(store: &EtcdStore, key: &Key, fingerprint: Fingerprint) -> idemstore::Lease {
    match store.reserve(key, fingerprint).await.unwrap() {
        Reservation::Acquired(lease) => lease,
        other => panic!("expected to acquire {key}, got {other:?}"),
    }
}

/// Every test that needs a cluster shares one, each under its own prefix.
#[test]
fn etcd_only_operations() {
    let cluster = Cluster::start();
    runtime().block_on(async {
        let mut client = Client::connect(cluster.endpoints(), None).await.unwrap();
        complete_with_commits_the_callers_operations_atomically(&cluster, &mut client).await;
        batches_fill_transactions_within_max_txn_ops(&cluster).await;
        indexes_follow_every_change_and_the_sweeper_empties_them(&cluster, &mut client).await;
        a_damaged_value_is_corruption_naming_the_key(&cluster, &mut client).await;
        a_refused_request_fails_at_once_and_says_nothing_was_applied(&cluster, &mut client).await;
        expire_deletes_the_record_and_its_index_entries_in_one_transaction(&cluster, &mut client)
            .await;
        what_this_process_wrote_is_a_guess_never_an_answer(&cluster).await;
        a_lease_that_ran_out_stays_listed_by_stale_after_a_sweep(&cluster, &mut client).await;
        a_prefix_of_another_layout_version_is_refused(&cluster, &mut client).await;
    });
}

/// A holder's next write starts from what its process last wrote (no read first); when
/// another instance changed the key meanwhile, the answer comes from the cluster.
async fn what_this_process_wrote_is_a_guess_never_an_answer(cluster: &Cluster) {
    let env = Env::new();
    let a = store(cluster, "guess/", &env.clock, 128).await;
    let b = store(cluster, "guess/", &env.clock, 128).await;
    let k = key("u", "op", "g1");
    let lease = acquire(&a, &k, fp("body")).await;
    // Another host completes the key with the lease (a worker that moved).
    b.complete(&lease, b"from b".to_vec()).await.unwrap();
    match a.reserve(&k, fp("body")).await.unwrap() {
        Reservation::Completed(done) => assert_eq!(done.result, b"from b"),
        other => panic!("the cluster's state, not this process's guess: {other:?}"),
    }
    let lost = a.extend(&lease).await;
    assert!(
        matches!(
            lost,
            Err(Error::LeaseLost {
                reason: LeaseLostReason::Completed { .. },
                ..
            })
        ),
        "{lost:?}"
    );
    // A takeover by another host fences this process's stale guess.
    let k2 = key("u", "op", "g2");
    let old = acquire(&a, &k2, fp("body")).await;
    env.advance(LEASE);
    let new = acquire(&b, &k2, fp("body")).await;
    let late = a.complete(&old, b"late".to_vec()).await;
    assert!(
        matches!(late, Err(Error::LeaseLost { reason: LeaseLostReason::TakenOver { by_token }, .. }) if by_token == new.token()),
        "{late:?}"
    );
    assert_eq!(
        a.reserve(&k2, fp("body")).await.unwrap(),
        Reservation::InProgress {
            retry_after: LEASE,
            attempt: 2
        }
    );
}

async fn complete_with_commits_the_callers_operations_atomically(
    cluster: &Cluster,
    client: &mut Client,
) {
    let env = Env::new();
    let store = store(cluster, "cw/", &env.clock, 128).await;
    let k = key("user-7", "checkout", "k1");
    let lease = acquire(&store, &k, fp("cart")).await;
    let order = TxnOp::put("orders/1", "1999", None);
    store
        .complete_with(&lease, b"order 1".to_vec(), vec![order])
        .await
        .unwrap();
    let stored = client.get("orders/1", None).await.unwrap();
    assert_eq!(stored.kvs()[0].value(), b"1999");
    let mut record_key = b"cw/r/".to_vec();
    record_key.extend_from_slice(&encoded(&k));
    let record = client.get(record_key, None).await.unwrap();
    assert_eq!(
        stored.kvs()[0].mod_revision(),
        record.kvs()[0].mod_revision(),
        "the order is written in the completion's transaction"
    );

    // Completing again: the first completion carried the operations; these are not applied.
    match store
        .complete_with(
            &lease,
            b"again".to_vec(),
            vec![TxnOp::put("orders/2", "1", None)],
        )
        .await
    {
        Err(Error::LeaseLost {
            reason: LeaseLostReason::Completed { by_token },
            ..
        }) => {
            assert_eq!(by_token, lease.token())
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    // A stale owner whose key was taken over: nothing is applied.
    let k2 = key("user-7", "checkout", "k2");
    let old = acquire(&store, &k2, fp("cart")).await;
    env.advance(LEASE);
    let new = acquire(&store, &k2, fp("cart")).await;
    match store
        .complete_with(
            &old,
            b"late".to_vec(),
            vec![TxnOp::put("orders/3", "1", None)],
        )
        .await
    {
        Err(Error::LeaseLost {
            reason: LeaseLostReason::TakenOver { by_token },
            ..
        }) => {
            assert_eq!(by_token, new.token())
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert_eq!(
        count(client, "orders/").await,
        1,
        "only the first completion's operation"
    );
}

async fn batches_fill_transactions_within_max_txn_ops(cluster: &Cluster) {
    let env = Env::new();
    // 120 new keys take one operation each, and the transaction's index entry 3: one
    // transaction of 128.
    let wide = store(cluster, "batch-wide/", &env.clock, 128).await;
    let items: Vec<(Key, Fingerprint)> = (0..120)
        .map(|i| (key("q", "o", &format!("{i}")), fp("m")))
        .collect();
    let tokens = acquired_tokens(&wide, &items).await;
    let revisions: std::collections::BTreeSet<u64> = tokens.iter().map(|t| t >> 10).collect();
    assert_eq!(
        revisions.len(),
        1,
        "one transaction for 120 keys: {tokens:?}"
    );
    // At 8 operations per transaction, 5 keys fit in each.
    let narrow = store(cluster, "batch-narrow/", &env.clock, 8).await;
    let tokens = acquired_tokens(&narrow, &items).await;
    let revisions: std::collections::BTreeSet<u64> = tokens.iter().map(|t| t >> 10).collect();
    assert_eq!(revisions.len(), 24, "five keys per transaction: {tokens:?}");
    // A second batch answers every key from its reads: all in progress, nothing written.
    for result in narrow.reserve_many(&items).await.unwrap() {
        assert!(
            matches!(result, Ok(Reservation::InProgress { attempt: 1, .. })),
            "{result:?}"
        );
    }
}

async fn acquired_tokens(store: &EtcdStore, items: &[(Key, Fingerprint)]) -> Vec<u64> {
    let mut tokens: Vec<u64> = store
        .reserve_many(items)
        .await
        .unwrap()
        .into_iter()
        .map(|r| match r {
            Ok(Reservation::Acquired(lease)) => lease.token(),
            other => panic!("expected Acquired, got {other:?}"),
        })
        .collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), items.len(), "every key has its own token");
    tokens
}

async fn indexes_follow_every_change_and_the_sweeper_empties_them(
    cluster: &Cluster,
    client: &mut Client,
) {
    let env = Env::new();
    let store = store(cluster, "ix/", &env.clock, 128).await;
    let ks: Vec<Key> = (0..6).map(|i| key("u", "o", &format!("{i}"))).collect();
    let mut leases = Vec::new();
    for k in &ks {
        leases.push(acquire(&store, k, fp("b")).await);
    }
    assert_eq!(
        counts(client, "ix/").await,
        (6, 6),
        "one entry per transaction"
    );
    store.complete(&leases[0], b"r".to_vec()).await.unwrap();
    store.release_if_pending(&leases[1]).await.unwrap();
    store.mark_needs_review(&leases[2], "check").await.unwrap();
    store.extend(&leases[3]).await.unwrap();
    // 0 completed and 3 extended have new entries; 2 under review never expires (no entry);
    // 1 is gone (a delete writes no entry). The older entries are spent, left to the sweep.
    assert_eq!(counts(client, "ix/").await, (5, 8));

    env.advance(RETENTION + LEASE * 2);
    let sweeper = store.spawn_sweeper(Duration::from_millis(20), 2).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while counts(client, "ix/").await.1 > 0 {
        assert!(
            Instant::now() < deadline,
            "the background sweeper did not empty the index: {:?}",
            counts(client, "ix/").await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(sweeper);
    assert_eq!(
        counts(client, "ix/").await,
        (1, 0),
        "the key under review stays"
    );
    assert!(matches!(
        store.reserve(&ks[2], fp("b")).await.unwrap(),
        Reservation::NeedsReview { .. }
    ));
}

/// A pending record whose lease ran out is moved by a sweep to the entries of ran-out leases
/// (it is not expired yet), where `stale` still finds it, and the next sweep after its expiry
/// deletes it; a key written again meanwhile is never deleted by an older entry.
async fn a_lease_that_ran_out_stays_listed_by_stale_after_a_sweep(
    cluster: &Cluster,
    client: &mut Client,
) {
    let env = Env::new();
    let store = store(cluster, "ran-out/", &env.clock, 128).await;
    let abandoned = key("u", "o", "abandoned");
    let again = key("u", "o", "again");
    let lease = acquire(&store, &abandoned, fp("b")).await;
    env.advance(Duration::from_millis(10));
    let first = acquire(&store, &again, fp("b")).await;
    env.advance(LEASE * 2);
    assert_eq!(store.sweep(10).await.unwrap(), 0, "nothing expired yet");
    assert_eq!(
        counts(client, "ran-out/").await,
        (2, 2),
        "both moved to the ran-out leases"
    );
    assert_eq!(count(client, "ran-out/s/").await, 2);
    let stale = store.stale(10).await.unwrap();
    let listed: Vec<&Key> = stale.iter().map(|(k, _)| k).collect();
    assert_eq!(listed, vec![&abandoned, &again], "oldest lease first");
    // `again` is taken over: its old entries are spent, its new one is its own.
    let taken = acquire(&store, &again, fp("b")).await;
    assert!(taken.token() > first.token());
    let stale = store.stale(10).await.unwrap();
    assert_eq!(stale.len(), 1, "{stale:?}");
    assert_eq!(stale[0].1.token(), lease.token());

    // Past the abandoned record's expiry, not past the takeover's.
    env.advance(RETENTION);
    assert_eq!(
        store.sweep(10).await.unwrap(),
        1,
        "the abandoned record expired"
    );
    assert_eq!(store.get(&abandoned).await.unwrap(), None);
    let held = store
        .get(&again)
        .await
        .unwrap()
        .expect("the takeover is kept");
    assert_eq!(held.token(), taken.token());
    assert_eq!(count(client, "ran-out/r/").await, 1);
    env.advance(RETENTION + LEASE);
    assert_eq!(store.sweep(10).await.unwrap(), 1);
    assert_eq!(counts(client, "ran-out/").await, (0, 0), "nothing left");
}

/// A prefix written by another layout version is refused at connect, naming the prefix and
/// the version; nothing under it is changed.
async fn a_prefix_of_another_layout_version_is_refused(cluster: &Cluster, client: &mut Client) {
    // Version 1 kept records with per-record index entries and no version key.
    client.put("old-layout/r/\x01s", "v", None).await.unwrap();
    client.put("old-layout/x/\x00", "", None).await.unwrap();
    let connect = |prefix: &'static str| async move {
        EtcdStore::builder()
            .prefix(prefix)
            .connect(&cluster.endpoints())
            .await
    };
    match connect("old-layout/").await {
        Err(Error::Open(idemstore::OpenError::InvalidConfig { setting, reason })) => {
            assert_eq!(setting, "prefix");
            assert!(
                reason.contains("`old-layout/`") && reason.contains("layout version 1"),
                "{reason}"
            );
            assert!(reason.contains("version 2"), "{reason}");
        }
        other => panic!("a version 1 prefix was not refused: {other:?}"),
    }
    assert_eq!(
        count(client, "old-layout/layout").await,
        0,
        "nothing written"
    );
    client.put("newer/layout", vec![9u8], None).await.unwrap();
    match connect("newer/").await {
        Err(Error::Open(idemstore::OpenError::InvalidConfig { reason, .. })) => {
            assert!(reason.contains("layout version 9"), "{reason}");
        }
        other => panic!("a version 9 prefix was not refused: {other:?}"),
    }
    // An empty prefix is written in this layout, and opens again.
    connect("fresh/").await.unwrap();
    let version = client.get("fresh/layout", None).await.unwrap();
    assert_eq!(version.kvs()[0].value(), &[2u8]);
    connect("fresh/").await.unwrap();
}

/// (records, index entries) under `prefix`.
async fn counts(client: &mut Client, prefix: &str) -> (i64, i64) {
    (
        count(client, &format!("{prefix}r/")).await,
        count(client, &format!("{prefix}i/")).await + count(client, &format!("{prefix}s/")).await,
    )
}

/// The cluster's current revision: one write transaction raises it by exactly one.
async fn revision(client: &mut Client) -> i64 {
    let response = client.get("rev/", None).await.unwrap();
    response.header().expect("a response header").revision()
}

async fn expire_deletes_the_record_and_its_index_entries_in_one_transaction(
    cluster: &Cluster,
    client: &mut Client,
) {
    let env = Env::new();
    let store = store(cluster, "ex/", &env.clock, 128).await;
    let [done, review, live] = ["done", "review", "live"].map(|id| key("u", "o", id));
    let lease = acquire(&store, &done, fp("b")).await;
    store.complete(&lease, b"r".to_vec()).await.unwrap();
    let lease = acquire(&store, &review, fp("b")).await;
    store.mark_needs_review(&lease, "check").await.unwrap();
    let holder = acquire(&store, &live, fp("b")).await;
    // One entry per write but the review (it never expires by itself).
    assert_eq!(counts(client, "ex/").await, (3, 4));

    let before = revision(client).await;
    assert_eq!(
        store.expire(&done).await.unwrap(),
        Some(RecordClass::Completed)
    );
    assert_eq!(revision(client).await, before + 1, "one transaction");
    assert_eq!(
        counts(client, "ex/").await,
        (2, 4),
        "spent entries wait for a sweep"
    );

    let refused = store.expire(&live).await;
    assert!(
        matches!(&refused, Err(Error::LeaseLive { key, .. }) if *key == live),
        "{refused:?}"
    );
    assert_eq!(
        counts(client, "ex/").await,
        (2, 4),
        "a refusal writes nothing"
    );

    let before = revision(client).await;
    assert_eq!(
        store.expire_forced(&live).await.unwrap(),
        Some(RecordClass::Pending)
    );
    assert_eq!(revision(client).await, before + 1, "one transaction");
    assert_eq!(counts(client, "ex/").await, (1, 4));
    let late = store.complete(&holder, b"late".to_vec()).await;
    assert!(
        matches!(
            late,
            Err(Error::LeaseLost {
                reason: LeaseLostReason::Gone,
                ..
            })
        ),
        "{late:?}"
    );

    assert_eq!(
        store.expire(&review).await.unwrap(),
        Some(RecordClass::NeedsReview)
    );
    assert_eq!(counts(client, "ex/").await, (0, 4));
    env.advance(RETENTION + LEASE);
    assert_eq!(store.sweep(10).await.unwrap(), 0, "nothing to delete");
    assert_eq!(
        count(client, "ex/").await,
        1,
        "nothing left under the prefix but its layout version"
    );
    assert_eq!(store.expire(&review).await.unwrap(), None);
    let again = acquire(&store, &live, fp("b")).await;
    assert!(again.token() > holder.token());
}

async fn a_damaged_value_is_corruption_naming_the_key(cluster: &Cluster, client: &mut Client) {
    let env = Env::new();
    let store = store(cluster, "bad/", &env.clock, 128).await;
    let k = key("user-1", "POST /charges", "damaged");
    let mut record_key = b"bad/r/".to_vec();
    record_key.extend_from_slice(&encoded(&k));
    for garbage in [&b""[..], b"\x01short", &[0xFF; 100]] {
        client.put(record_key.clone(), garbage, None).await.unwrap();
        for error in [
            store.get(&k).await.unwrap_err(),
            store.reserve(&k, fp("b")).await.unwrap_err(),
        ] {
            match &error {
                Error::Storage(idemstore::StorageError::Corruption { location, .. }) => {
                    assert!(location.contains(&k.to_string()), "{error}")
                }
                other => panic!("expected Corruption, got {other:?}"),
            }
        }
    }
}

async fn a_refused_request_fails_at_once_and_says_nothing_was_applied(
    cluster: &Cluster,
    client: &mut Client,
) {
    let env = Env::new();
    // More operations per transaction than the cluster's --max-txn-ops (128) allows.
    let store = store(cluster, "refused/", &env.clock, 1024).await;
    let items: Vec<(Key, Fingerprint)> = (0..200)
        .map(|i| (key("q", "o", &format!("{i}")), fp("m")))
        .collect();
    let started = Instant::now();
    match store.reserve_many(&items).await {
        Err(error @ Error::Cluster { .. }) => {
            // The message says what failed; the cluster's own words are its `source()`.
            let mut chain = error.to_string();
            let mut cause = std::error::Error::source(&error);
            while let Some(inner) = cause {
                chain.push_str(&format!(": {inner}"));
                cause = inner.source();
            }
            assert!(chain.contains("nothing was applied"), "{chain}");
            assert!(chain.contains("too many operations"), "{chain}");
        }
        other => panic!("expected a Cluster error, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a refusal is not retried"
    );
    assert_eq!(count(client, "refused/r/").await, 0);
    assert_eq!(store.sweep(0).await.unwrap(), 0);
}

#[test]
fn settings_out_of_range_are_refused_before_connecting() {
    type Change = fn(&mut idemstore::EtcdBuilder);
    let cases: [(&str, Change); 4] = [
        ("max_txn_ops", |b| {
            b.max_txn_ops(4);
        }),
        ("max_result_len", |b| {
            b.max_result_len(2 << 20);
        }),
        ("prefix", |b| {
            b.prefix("");
        }),
        ("lease", |b| {
            b.lease(Duration::ZERO);
        }),
    ];
    for (setting, change) in cases {
        let mut builder = EtcdStore::builder();
        change(&mut builder);
        // No cluster listens there: the settings are checked first.
        let result = runtime().block_on(builder.connect(&["127.0.0.1:1"]));
        match result {
            Err(Error::Open(idemstore::OpenError::InvalidConfig { setting: s, .. })) => {
                assert_eq!(s, setting)
            }
            other => panic!("{setting}: expected InvalidConfig, got {other:?}"),
        }
    }
}

#[test]
fn a_missing_etcd_binary_fails_with_how_to_install_it() {
    let Err(panic) = std::panic::catch_unwind(|| Cluster::start_with("/nonexistent/etcd")) else {
        panic!("a cluster started without an etcd binary");
    };
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("apt-get install etcd-server"), "{message}");
}
