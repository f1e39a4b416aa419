//! The fault test on etcd: the shared clients and checker (`tests/common/fault.rs`) while the
//! leader, then a random member, is killed with SIGKILL and restarted, one member down at a
//! time. 3 rounds by default; `IDEMSTORE_LONG=1` runs 20.

use std::time::Duration;

use idemstore::EtcdStore;

use super::cluster::Cluster;
use crate::common::fault::{self, Rng, LEASE, SHORT};

#[test]
fn acknowledged_work_survives_killed_members_and_fencing_holds() {
    let mut cluster = Cluster::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let connect = |cluster: &Cluster| {
        runtime
            .block_on(
                EtcdStore::builder()
                    .prefix("fault/")
                    .lease(LEASE)
                    .retention(Duration::from_secs(3600))
                    .retention_for("short", SHORT)
                    .request_timeout(Duration::from_millis(700))
                    .op_deadline(Duration::from_secs(20))
                    .connect(&cluster.endpoints()),
            )
            .expect("connect to the test cluster")
    };
    let store = connect(&cluster);
    let rounds = fault::rounds();
    let (history, final_state) = fault::exercise(&runtime, &store, || {
        let mut rng = Rng(0xD1B5_4A32_D192_ED03);
        for round in 0..rounds {
            std::thread::sleep(Duration::from_millis(800));
            let leader = cluster.leader().expect("a leader before the kill");
            let random = rng.below(3) as usize;
            for victim in [leader, random] {
                eprintln!("round {round}: SIGKILL member {victim}");
                cluster.kill(victim);
                std::thread::sleep(Duration::from_millis(1200));
                cluster.restart(victim);
                std::thread::sleep(Duration::from_millis(600));
            }
        }
    });
    eprintln!(
        "fault test: {rounds} rounds, {} requests resent after no definite answer",
        store.resends()
    );
    fault::check(&history, &final_state);
}
