//! What the scenarios do not tell: the schema and its version check, `complete_with` on the
//! caller's transaction, settings refused, tokens from the sequence, and the error of an
//! unreachable server.

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
        client
            .execute(
                "UPDATE versioned_meta SET value = '7' WHERE name = 'schema_version'",
                &[],
            )
            .await
            .unwrap();
        match PgStore::builder()
            .table("versioned")
            .connect(&server.config())
            .await
        {
            Err(Error::InvalidConfig { setting, reason }) => {
                assert_eq!(setting, "table");
                assert!(
                    reason.contains("version 7") && reason.contains("version 1"),
                    "{reason}"
                );
            }
            other => panic!("expected the version to be refused, got {other:?}"),
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
            Err(Error::InvalidConfig { reason, .. }) => {
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
            Err(Error::InvalidConfig { setting, .. }) => {
                assert!(!ok, "{table:?} refused");
                assert_eq!(setting, "table");
            }
            Err(Error::Cluster { context, .. }) => {
                assert!(ok, "{table:?} should be refused before connecting");
                assert!(context.contains("connecting to PostgreSQL"), "{context}");
            }
            other => panic!("{table:?}: {other:?}"),
        }
    }
    match rt.block_on(PgStore::builder().pool_size(0).connect("host=127.0.0.1")) {
        Err(Error::InvalidConfig { setting, .. }) => assert_eq!(setting, "pool_size"),
        other => panic!("{other:?}"),
    }
    match rt.block_on(PgStore::connect("host=127.0.0.1 port=notanumber")) {
        Err(Error::InvalidConfig { setting, .. }) => assert_eq!(setting, "config"),
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
        Err(error @ Error::Cluster { .. }) => {
            assert!(error.to_string().contains("PostgreSQL"), "{error}")
        }
        other => panic!("expected a connection error, got {other:?}"),
    }
}
