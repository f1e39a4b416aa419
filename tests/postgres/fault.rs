//! The fault test on PostgreSQL: the shared clients and checker (`tests/common/fault.rs`)
//! while the PostgreSQL server (the postmaster and every backend) is killed with SIGKILL and
//! started again, going through crash recovery. 3 kills by default; `IDEMSTORE_LONG=1` runs 20.

use std::time::Duration;

use idemstore::PgStore;

use super::server::Server;
use crate::common::fault::{self, LEASE, SHORT};

#[test]
fn acknowledged_work_survives_a_killed_server_and_fencing_holds() {
    let mut server = Server::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let store = runtime
        .block_on(
            PgStore::builder()
                .table("fault")
                .lease(LEASE)
                .retention(Duration::from_secs(3600))
                .retention_for("short", SHORT)
                .pool_size(16)
                .statement_timeout(Duration::from_millis(2000))
                .op_deadline(Duration::from_secs(20))
                .connect(&server.config()),
        )
        .expect("connect to the test server");
    let rounds = fault::rounds();
    let (history, final_state) = fault::exercise(&runtime, &store, || {
        for round in 0..rounds {
            std::thread::sleep(Duration::from_millis(1000));
            eprintln!("round {round}: SIGKILL the server");
            server.kill();
            std::thread::sleep(Duration::from_millis(700));
            server.restart();
        }
    });
    eprintln!(
        "fault test: {rounds} kills, {} requests resent after no definite answer",
        store.resends()
    );
    fault::check(&history, &final_state);
}
