//! What the scenarios do not tell: the schema and its version check, completions written as
//! HOT updates, `complete_with` on the caller's transaction, settings refused, tokens from the
//! sequence, `reserve_or_wait` woken by a notification, and the error of an unreachable
//! server.

use std::time::Duration;

use idemstore::{Error, Fingerprint, Key, LeaseLostReason, PgStore, Reservation};

use super::server::Server;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn key(id: &str) -> Key {
    Key::new("user-1", "checkout", id).unwrap()
}

async fn acquire(store: &PgStore, key: &Key) -> idemstore::Lease {
    match store.reserve(key, Fingerprint::of(b"cart")).await.unwrap() {
        Reservation::Acquired(lease) => lease,
        other => panic!("expected to acquire {key}, got {other:?}"),
    }
}

/// A raw client for the test's own statements.
async fn raw(server: &Server) -> idemstore::tokio_postgres::Client {
    let (client, connection) =
        idemstore::tokio_postgres::connect(&server.config(), idemstore::tokio_postgres::NoTls)
            .await
            .expect("connect");
    tokio::spawn(connection);
    client
}

#[test]
fn a_schema_of_another_version_is_refused_naming_both() {
    let server = Server::start();
    runtime().block_on(async {
        let store = PgStore::builder()
            .table("versioned")
            .connect(&server.config())
            .await
            .expect("first connect creates the schema");
        // Connecting again finds the schema and accepts it.
        PgStore::builder()
            .table("versioned")
            .connect(&server.config())
            .await
            .expect("second connect");
        drop(store);
        let client = raw(&server).await;
        // A later build's table, and the first schema's (an expiry index, a lease index,
        // completions that were not HOT updates): both refused, naming both versions.
        for found in ["7", "1"] {
            client
                .execute(
                    "UPDATE versioned_meta SET value = $1 WHERE name = 'schema_version'",
                    &[&found],
                )
                .await
                .unwrap();
            match PgStore::builder()
                .table("versioned")
                .connect(&server.config())
                .await
            {
                Err(Error::Open(idemstore::OpenError::InvalidConfig { setting, reason })) => {
                    assert_eq!(setting, "table");
                    assert!(
                        reason.contains(&format!("version {found};"))
                            && reason.contains("writes version 3"),
                        "{reason}"
                    );
                }
                other => panic!("expected version {found} to be refused, got {other:?}"),
            }
        }
        // A table of the same name that idemstore did not make is refused too.
        client
            .batch_execute("CREATE TABLE orders (id bigint)")
            .await
            .unwrap();
        match PgStore::builder()
            .table("orders")
            .connect(&server.config())
            .await
        {
            Err(Error::Open(idemstore::OpenError::InvalidConfig { reason, .. })) => {
                assert!(reason.contains("not made by idemstore"), "{reason}")
            }
            other => panic!("expected a foreign table to be refused, got {other:?}"),
        }
    });
}

#[test]
fn bad_settings_name_the_setting() {
    let rt = runtime();
    for (table, ok) in [
        ("Bad-Name", false),
        ("", false),
        ("9lives", false),
        ("ok_1", true),
    ] {
        let result = rt.block_on(
            PgStore::builder()
                .table(table)
                .connect("host=127.0.0.1 port=1 connect_timeout=1"),
        );
        match result {
            Err(Error::Open(idemstore::OpenError::InvalidConfig { setting, .. })) => {
                assert!(!ok, "{table:?} refused");
                assert_eq!(setting, "table");
            }
            Err(Error::Database { context, .. }) => {
                assert!(ok, "{table:?} should be refused before connecting");
                assert!(context.contains("connecting to PostgreSQL"), "{context}");
            }
            other => panic!("{table:?}: {other:?}"),
        }
    }
    match rt.block_on(PgStore::builder().pool_size(0).connect("host=127.0.0.1")) {
        Err(Error::Open(idemstore::OpenError::InvalidConfig { setting, .. })) => {
            assert_eq!(setting, "pool_size")
        }
        other => panic!("{other:?}"),
    }
    match rt.block_on(PgStore::connect("host=127.0.0.1 port=notanumber")) {
        Err(Error::Open(idemstore::OpenError::InvalidConfig { setting, .. })) => {
            assert_eq!(setting, "config")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn complete_with_commits_the_callers_statements_with_the_completion_or_neither() {
    let server = Server::start();
    runtime().block_on(async {
        let store = PgStore::builder()
            .table("with_work")
            .connect(&server.config())
            .await
            .unwrap();
        let client = raw(&server).await;
        client
            .batch_execute("CREATE TABLE orders (id bigint PRIMARY KEY, cents bigint NOT NULL)")
            .await
            .unwrap();
        let orders = || async {
            client
                .query_one("SELECT count(*) FROM orders", &[])
                .await
                .unwrap()
                .get::<_, i64>(0)
        };

        // The work fails: rolled back, the key still pending under the same lease.
        let k = key("k1");
        let lease = acquire(&store, &k).await;
        let failed = store
            .complete_with(&lease, b"order 1".to_vec(), |tx| {
                Box::pin(async move {
                    tx.execute("INSERT INTO orders VALUES (1, 1999)", &[])
                        .await?;
                    tx.execute("INSERT INTO orders VALUES (1, 1999)", &[])
                        .await?;
                    Ok::<(), idemstore::tokio_postgres::Error>(())
                })
            })
            .await;
        assert!(matches!(failed, Err(Error::Callback { .. })), "{failed:?}");
        assert_eq!(
            orders().await,
            0,
            "the caller's first insert was rolled back"
        );
        assert!(matches!(
            store.get(&k).await.unwrap().unwrap().status(),
            idemstore::Status::Pending { .. }
        ));

        // The work succeeds: both are committed.
        store
            .complete_with(&lease, b"order 1".to_vec(), |tx| {
                Box::pin(async move {
                    tx.execute("INSERT INTO orders VALUES (1, 1999)", &[])
                        .await?;
                    Ok::<(), idemstore::tokio_postgres::Error>(())
                })
            })
            .await
            .expect("complete_with");
        assert_eq!(orders().await, 1);
        match store.reserve(&k, Fingerprint::of(b"cart")).await.unwrap() {
            Reservation::Completed(done) => assert_eq!(done.result, b"order 1"),
            other => panic!("expected the stored result, got {other:?}"),
        }

        // Again with the same lease: lease lost, the work does not run.
        let again = store
            .complete_with(&lease, b"order 2".to_vec(), |tx| {
                Box::pin(async move {
                    tx.execute("INSERT INTO orders VALUES (2, 1)", &[]).await?;
                    Ok::<(), idemstore::tokio_postgres::Error>(())
                })
            })
            .await;
        match again {
            Err(Error::LeaseLost { reason, .. }) => assert_eq!(
                reason,
                LeaseLostReason::Completed {
                    by_token: lease.token()
                }
            ),
            other => panic!("expected LeaseLost, got {other:?}"),
        }
        assert_eq!(orders().await, 1, "the work of a lost lease never runs");
    });
}

#[test]
fn tokens_come_from_the_sequence_and_rise_across_stores() {
    let server = Server::start();
    runtime().block_on(async {
        let config = server.config();
        let connect = || async {
            PgStore::builder()
                .table("tokens")
                .lease(Duration::from_millis(1))
                .connect(&config)
                .await
        };
        let a = connect().await.unwrap();
        let b = connect().await.unwrap();
        let mut last = 0;
        for i in 0..20 {
            let store = if i % 2 == 0 { &a } else { &b };
            let k = key(&format!("t{i}"));
            let lease = acquire(store, &k).await;
            assert!(lease.token() > last, "{} after {last}", lease.token());
            last = lease.token();
            // The lease (1 ms) runs out: the other store takes it over with a higher token.
            tokio::time::sleep(Duration::from_millis(5)).await;
            let other = if i % 2 == 0 { &b } else { &a };
            let taken = acquire(other, &k).await;
            assert!(taken.token() > last);
            assert_eq!(taken.attempt(), 2);
            last = taken.token();
        }
    });
}

#[test]
fn an_unreachable_server_is_an_error_naming_postgres() {
    let rt = runtime();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let result = rt.block_on(PgStore::connect(&format!(
        "host=127.0.0.1 port={port} user=postgres connect_timeout=2"
    )));
    match result {
        Err(error @ Error::Database { .. }) => {
            let text = error.to_string();
            assert!(
                text.starts_with("PostgreSQL error while connecting"),
                "{text}"
            );
            assert!(!text.contains("cluster"), "{text}");
        }
        other => panic!("expected a connection error, got {other:?}"),
    }
}

/// A waiter is woken by the completion's notification, not by its poll: with the poll at 60 s
/// and the lease at 10 min, only a notification can end the wait within 55 s. The waiter
/// has marked the row (`watched`) before the key is completed, so the wake is the
/// notification's and not the first reserve's.
#[test]
fn a_waiter_is_woken_by_the_completion_not_by_polling() {
    let server = Server::start();
    runtime().block_on(async {
        let store = PgStore::builder()
            .table("waits")
            .lease(Duration::from_secs(600))
            .wait_poll(Duration::from_secs(60))
            .connect(&server.config())
            .await
            .unwrap();
        let client = raw(&server).await;
        for round in 0..2 {
            let key = key(&format!("waited-{round}"));
            let lease = acquire(&store, &key).await;
            let waiter = {
                let (store, key) = (store.clone(), key.clone());
                tokio::spawn(async move {
                    store
                        .reserve_or_wait(&key, Fingerprint::of(b"cart"), Duration::from_secs(120))
                        .await
                })
            };
            // Wait until the waiter has marked the row, however long that takes.
            loop {
                let row = client
                    .query_one(
                        "SELECT watched FROM waits WHERE key = $1",
                        &[&crate::common::encoded(&key)],
                    )
                    .await
                    .unwrap();
                if row.get::<_, bool>(0) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if round == 0 {
                store.complete(&lease, b"done".to_vec()).await.unwrap();
            } else {
                // A release wakes too, and the waiter then acquires the key.
                assert!(store.release_if_pending(&lease).await.unwrap());
            }
            let answer = tokio::time::timeout(Duration::from_secs(55), waiter)
                .await
                .expect("woken by the notification, before the 60 s poll")
                .unwrap()
                .unwrap();
            match (round, answer) {
                (0, Reservation::Completed(done)) => assert_eq!(done.result, b"done"),
                (1, Reservation::Acquired(again)) => assert!(again.token() > lease.token()),
                (_, other) => panic!("round {round}: {other:?}"),
            }
        }
    });
}

/// A completion changes no indexed column: PostgreSQL writes it as a heap-only (HOT) update,
/// with no new index entries and none left dead (`pg_stat_user_tables.n_tup_hot_upd`).
#[test]
fn completions_are_hot_updates() {
    let server = Server::start();
    runtime().block_on(async {
        let store = PgStore::builder()
            .table("hot")
            .connect(&server.config())
            .await
            .unwrap();
        for i in 0..50 {
            let lease = acquire(&store, &key(&format!("h{i}"))).await;
            store.complete(&lease, vec![7; 64]).await.unwrap();
        }
        let client = raw(&server).await;
        // The statistics reach the view when the backends report them (at most every second
        // while busy, at once when idle); wait for all 50 updates to be counted.
        let (updates, hot) = loop {
            let row = client
                .query_one(
                    "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'hot'",
                    &[],
                )
                .await
                .unwrap();
            let counted: (i64, i64) = (row.get(0), row.get(1));
            if counted.0 >= 50 {
                break counted;
            }
            client.batch_execute("SELECT pg_stat_clear_snapshot()").await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // A HOT update also needs room on the row's page, which pruning makes unless a
        // concurrent snapshot (an autovacuum's ANALYZE) holds the old versions back: nearly
        // all, then. A schema that indexed a column the completion changes makes none.
        assert!(
            hot * 10 >= updates * 9,
            "{hot} of {updates} completions were HOT updates"
        );
    });
}

/// With `index_stale`, `stale` reads the index of pending rows rather than the table: of
/// 20,000 completed rows and 3 reservations whose lease ended, the three come back, found
/// through the index (`pg_stat_user_indexes.idx_scan`). A store built without it has no such
/// index, and its completions stay HOT updates (`completions_are_hot_updates`).
#[test]
fn stale_reads_the_index_of_pending_rows_when_asked() {
    let server = Server::start();
    runtime().block_on(async {
        let clock = idemstore::ManualClock::new();
        let store = PgStore::builder()
            .table("staled")
            .index_stale(true)
            .lease(Duration::from_secs(1))
            .clock(clock.clone())
            .connect(&server.config())
            .await
            .unwrap();
        for batch in 0..20 {
            let items: Vec<_> = (0..1000)
                .map(|i| (key(&format!("done-{batch}-{i}")), Fingerprint::of(b"cart")))
                .collect();
            let leases: Vec<_> = store
                .reserve_many(&items)
                .await
                .unwrap()
                .into_iter()
                .map(|answer| match answer.unwrap() {
                    Reservation::Acquired(lease) => lease,
                    other => panic!("a new key: {other:?}"),
                })
                .collect();
            let completions = leases.iter().map(|lease| (lease, b"ok".to_vec())).collect();
            for done in store.complete_many(completions).await.unwrap() {
                done.unwrap();
            }
        }
        for i in 0..3 {
            acquire(&store, &key(&format!("stuck-{i}"))).await;
        }
        clock.advance(Duration::from_secs(5));
        let client = raw(&server).await;
        client.batch_execute("ANALYZE staled").await.unwrap();
        let stale = store.stale(10).await.unwrap();
        let mut names: Vec<String> = stale.iter().map(|(key, _)| key.to_string()).collect();
        names.sort();
        assert_eq!(
            names,
            ["stuck-0", "stuck-1", "stuck-2"].map(|id| key(id).to_string())
        );
        // Statistics reach the view when the backend reports them (at most a second later).
        let mut scans = 0;
        for _ in 0..100 {
            let row = client
                .query_opt(
                    "SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'staled_stale'",
                    &[],
                )
                .await
                .unwrap()
                .expect("index_stale(true) made the index staled_stale");
            scans = row.get::<_, i64>(0);
            if scans > 0 {
                break;
            }
            client
                .batch_execute("SELECT pg_stat_clear_snapshot()")
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            scans > 0,
            "stale read the table, not the index of pending rows"
        );

        PgStore::builder()
            .table("plain")
            .connect(&server.config())
            .await
            .unwrap();
        let row = client
            .query_one("SELECT to_regclass('plain_stale') IS NULL", &[])
            .await
            .unwrap();
        assert!(
            row.get::<_, bool>(0),
            "a default store has no index of pending rows"
        );
    });
}

/// The listening connection dropped (its backend terminated) while a caller waits, and the
/// completion's notification went nowhere: the wait still ends with the completion's answer,
/// woken when the listener reconnects (it then wakes every waiter) or by the poll.
#[test]
fn a_wait_outlives_a_dropped_listening_connection() {
    let server = Server::start();
    runtime().block_on(async {
        let store = PgStore::builder()
            .table("dropped")
            .lease(Duration::from_secs(600))
            .wait_poll(Duration::from_millis(300))
            .connect(&server.config())
            .await
            .unwrap();
        let client = raw(&server).await;
        let key = key("dropped");
        let lease = acquire(&store, &key).await;
        let waiter = {
            let (store, key) = (store.clone(), key.clone());
            tokio::spawn(async move {
                store
                    .reserve_or_wait(&key, Fingerprint::of(b"cart"), Duration::from_secs(120))
                    .await
            })
        };
        // The waiter has marked the row and the listener answers: end the listener's backend.
        let terminated = loop {
            let row = client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN dropped_wake'",
                    &[],
                )
                .await
                .unwrap();
            let watched = client
                .query_one(
                    "SELECT watched FROM dropped WHERE key = $1",
                    &[&crate::common::encoded(&key)],
                )
                .await
                .unwrap();
            if row.get::<_, i64>(0) == 1 && watched.get::<_, bool>(0) {
                break client
                    .query_one(
                        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) \
                         FROM pg_stat_activity WHERE query = 'LISTEN dropped_wake'",
                        &[],
                    )
                    .await
                    .unwrap()
                    .get::<_, i64>(0);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(terminated, 1, "the listening connection's backend");
        store.complete(&lease, b"done".to_vec()).await.unwrap();
        // Nothing but the listener's reconnection or the 300 ms poll can end the wait before
        // its 120 s timeout (the lease lasts 10 min).
        let answer = tokio::time::timeout(Duration::from_secs(50), waiter)
            .await
            .expect("woken by the reconnected listener or the poll, not the wait's timeout")
            .unwrap()
            .unwrap();
        match answer {
            Reservation::Completed(done) => assert_eq!(done.result, b"done"),
            other => panic!("{other:?}"),
        }
    });
}

/// `sweep_at` is the expiry rounded up to the second, so the rows of one second share one
/// entry of the sweep index (B-tree deduplication), and a completion leaves it as it was; the
/// sweep still finds a row once it expired, although its `sweep_at` is later.
#[test]
fn sweep_at_is_the_expiry_rounded_up_to_the_second_and_sweeping_finds_it() {
    let server = Server::start();
    // A time between two whole seconds, so rounding shows.
    let clock = idemstore::ManualClock::starting_at(
        std::time::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
    );
    runtime().block_on(async {
        let store = PgStore::builder()
            .table("rounded")
            .lease(Duration::from_millis(300))
            .retention(Duration::from_secs(10))
            .clock(clock.clone())
            .connect(&server.config())
            .await
            .unwrap();
        let keys: Vec<Key> = (0..40).map(|i| key(&format!("s{i}"))).collect();
        let mut leases = Vec::new();
        for k in &keys[..20] {
            leases.push(acquire(&store, k).await);
        }
        let items: Vec<(Key, Fingerprint)> = keys[20..]
            .iter()
            .map(|k| (k.clone(), Fingerprint::of(b"cart")))
            .collect();
        for answer in store.reserve_many(&items).await.unwrap() {
            match answer.unwrap() {
                Reservation::Acquired(lease) => leases.push(lease),
                other => panic!("expected to acquire, got {other:?}"),
            }
        }
        for lease in &leases[..30] {
            store.complete(lease, b"done".to_vec()).await.unwrap();
        }
        let client = raw(&server).await;
        let row = client
            .query_one(
                "SELECT count(*) FILTER (WHERE sweep_at % 1000 <> 0 OR sweep_at < expires_at), \
                 count(DISTINCT sweep_at), min(sweep_at) FROM rounded",
                &[],
            )
            .await
            .unwrap();
        let (off, distinct, sweep_at): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        assert_eq!(
            off, 0,
            "rows whose sweep_at is not a whole second at or after their expiry"
        );
        // Reserved at one instant: the pending expiry is ...10.423 s, rounded to ...11 s; the
        // completions expire earlier (...10.123 s) and leave it there.
        assert_eq!((distinct, sweep_at), (1, 1_700_000_011_000));
        // At the completions' expiry, 0.877 s before their sweep_at, a sweep deletes them.
        clock.advance(Duration::from_secs(10));
        assert_eq!(
            store.sweep(100).await.unwrap(),
            30,
            "completed rows swept at expiry"
        );
        clock.advance(Duration::from_millis(300));
        assert_eq!(
            store.sweep(100).await.unwrap(),
            10,
            "pending rows swept at expiry"
        );
    });
}

/// A row's `body` is the record's encoding less its token field (the `token` column holds
/// it): 8 bytes shorter, read back whole with the column's token, and a damaged body is still
/// reported as corruption naming the key (the checksum covers the token's place).
#[test]
fn the_body_leaves_the_token_to_its_column_and_damage_is_reported() {
    let server = Server::start();
    runtime().block_on(async {
        let store = PgStore::builder()
            .table("bodies")
            .connect(&server.config())
            .await
            .unwrap();
        let k = key("b1");
        let lease = acquire(&store, &k).await;
        store.complete(&lease, b"done".to_vec()).await.unwrap();
        let record = store.get(&k).await.unwrap().expect("the record");
        assert_eq!(
            record.token(),
            lease.token(),
            "the token comes from its column"
        );
        let client = raw(&server).await;
        let row = client
            .query_one("SELECT octet_length(body), token FROM bodies", &[])
            .await
            .unwrap();
        let (len, token): (i32, i64) = (row.get(0), row.get(1));
        assert_eq!(token.cast_unsigned(), lease.token());
        // The encoding: version, tag, fingerprint (32), token (8), attempt (4), two times (16),
        // payload length (4), the 4-byte result, checksum (4): 74 bytes, 66 without the token.
        assert_eq!(len, 66, "the stored body's length");
        // One bit flipped after the token's place.
        client
            .execute(
                "UPDATE bodies SET body = set_byte(body, 40, get_byte(body, 40) # 1)",
                &[],
            )
            .await
            .unwrap();
        match store.get(&k).await {
            Err(Error::Storage(idemstore::StorageError::Corruption { location, .. })) => {
                assert!(location.contains(&k.to_string()), "{location}")
            }
            other => panic!("expected the damaged row to be reported, got {other:?}"),
        }
    });
}

/// A batch's rows answer by their nonces (consecutive within a statement), not by their keys:
/// with keys that exist, keys named twice and new keys mixed, in an order that is not key
/// order, each acquired lease names the token its own row holds, and another store (which
/// holds no hint of this one's writes) completes with it.
#[test]
fn a_batchs_answers_name_each_rows_own_token() {
    let server = Server::start();
    runtime().block_on(async {
        let config = server.config();
        let connect = || async { PgStore::builder().table("mapped").connect(&config).await };
        let (a, b) = (connect().await.unwrap(), connect().await.unwrap());
        let fp = Fingerprint::of(b"cart");
        // Every third key is held by the other store already.
        let mut items = Vec::new();
        for i in (0..90).rev() {
            let k = key(&format!("m{i:02}"));
            if i % 3 == 0 {
                acquire(&b, &k).await;
            }
            items.push((k, fp));
        }
        items.push(items[4].clone()); // a new key, named twice
        let answers = a.reserve_many(&items).await.unwrap();
        let mut tokens = Vec::new();
        for (i, answer) in answers.iter().enumerate() {
            let k = &items[i].0;
            let held = i < 90 && (89 - i) % 3 == 0;
            match answer {
                Ok(Reservation::Acquired(lease)) if !held && i < 90 => {
                    assert_eq!(lease.key(), k);
                    let stored = a.get(k).await.unwrap().expect("the row");
                    assert_eq!(lease.token(), stored.token(), "item {i} ({k})");
                    tokens.push(lease.token());
                    b.complete(lease, format!("r{i}").into_bytes())
                        .await
                        .unwrap();
                }
                Ok(Reservation::InProgress { .. }) if held || i == 90 => {}
                other => panic!("item {i} ({k}), held: {held}: {other:?}"),
            }
        }
        assert_eq!(tokens.len(), 60);
        tokens.sort_unstable();
        tokens.dedup();
        assert_eq!(tokens.len(), 60, "every acquisition has its own token");
    });
}

/// A key kept for less than its operation's retention is swept at its own expiry, not at the
/// pending record's (an hour later here): a completion with a shorter per-call retention, and
/// a key under review settled with a retention (its row had no expiry at all). Completions
/// kept for the operation's retention (`complete`, `complete_with`) are not swept then, and
/// leave `sweep_at` as it was (`completions_are_hot_updates`).
#[test]
fn a_key_kept_shorter_than_its_operation_is_swept_at_its_own_expiry() {
    let server = Server::start();
    let clock = idemstore::ManualClock::starting_at(
        std::time::UNIX_EPOCH + Duration::from_millis(1_700_000_000_000),
    );
    runtime().block_on(async {
        let store = PgStore::builder()
            .table("shorter")
            .lease(Duration::from_secs(2))
            .retention(Duration::from_secs(3600))
            .clock(clock.clone())
            .connect(&server.config())
            .await
            .unwrap();
        let short = Duration::from_secs(10);
        let one = acquire(&store, &key("one")).await;
        store
            .complete_with_retention(&one, b"done".to_vec(), short)
            .await
            .unwrap();
        let with = acquire(&store, &key("with")).await;
        store
            .complete_with(&with, b"done".to_vec(), |_| {
                Box::pin(async { Ok::<(), idemstore::tokio_postgres::Error>(()) })
            })
            .await
            .unwrap();
        let reviewed = acquire(&store, &key("reviewed")).await;
        store.mark_needs_review(&reviewed, "check").await.unwrap();
        store
            .resolve_with_retention(
                &key("reviewed"),
                idemstore::Resolution::Complete(b"settled".to_vec()),
                short,
            )
            .await
            .unwrap();
        // Kept for the operation's retention: not swept with the others.
        let kept = acquire(&store, &key("kept")).await;
        store.complete(&kept, b"done".to_vec()).await.unwrap();
        clock.advance(short + Duration::from_millis(1));
        assert_eq!(
            store.sweep(100).await.unwrap(),
            2,
            "the completion and the resolution kept for 10 s, swept at their expiry"
        );
        for (name, swept) in [
            ("one", true),
            ("reviewed", true),
            ("with", false),
            ("kept", false),
        ] {
            let client = raw(&server).await;
            let rows = client
                .query(
                    "SELECT 1 FROM shorter WHERE key = $1",
                    &[&crate::common::encoded(&key(name))],
                )
                .await
                .unwrap();
            assert_eq!(rows.is_empty(), swept, "key {name}");
        }
    });
}
