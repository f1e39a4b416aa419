//! The state-machine test through the [`Reservations`] trait, on every backend: the local
//! `Store`, and under their features the PostgreSQL store (`PgStore`) and the etcd store
//! (`EtcdStore`). Random sequences of the trait's operations (reserve, complete,
//! complete_with_retention, release_if_pending, extend, mark_needs_review, resolve, expire
//! with and without force), clock steps forward, and between any two of them the backend's own
//! background work, run against the one reference model (`support/model.rs`):
//!
//! - the local store: each step of its engine's background work (`Store::__background`: the
//!   applier's apply and commit, the writer's drain, the overlay's move to the cache, a
//!   checkpoint, window deletion, a flush) and a sweep;
//! - PostgreSQL: a sweep (what its sweeper runs), and the server killed (SIGKILL) and
//!   restarted on its data (crash recovery);
//! - etcd: a sweep, and a member of the three killed and restarted (the leader or not).
//!
//! Every answer is compared as in `model.rs` (variants, tokens, attempts, results, deadlines,
//! leases lost). One thing is left open by the contract: a record that has expired may or may
//! not still be stored (a sweep deletes expired records at its own pace), so `expire` of an
//! expired record may answer that it expired or that nothing was there. The clock moves forward
//! only here: a step back is the local store's (model.rs), whose time holds; the remote stores
//! read the clock of each process.
//!
//! Cases: 64 on the local store under `cargo test`; 24 on each remote backend (its CI step),
//! and `PROPTEST_CASES` for any other count.

use std::future::Future;
use std::time::Duration;

use idemstore::{
    Error, Lease, LiveLease, ManualClock, RecordClass, Reservations, Resolution, Store,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::model::{
    advance_ms, at, body_of, check_expired, check_lost, check_record, key_of, model_body, observed,
    operation_of, retention_of, BODIES, CONSUME_RETENTION_MS, KEYS, LEASE_MS,
    OVERRIDE_RETENTION_MS, REFUNDS_RETENTION_MS, RETENTION_MS,
};
use crate::support::model::{Answer, Keys, Model};

/// One step of a sequence.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Reserve {
        key: usize,
        body: usize,
    },
    Complete {
        lease: u16,
    },
    CompleteWithRetention {
        lease: u16,
    },
    Release {
        lease: u16,
    },
    Extend {
        lease: u16,
    },
    MarkNeedsReview {
        lease: u16,
    },
    Resolve {
        key: usize,
        complete: bool,
    },
    Expire {
        key: usize,
        force: bool,
    },
    Advance {
        ms: u64,
    },
    /// One step of the backend's background work, by number (each backend maps it).
    Background {
        step: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..KEYS, 0..BODIES).prop_map(|(key, body)| Op::Reserve { key, body }),
        3 => any::<u16>().prop_map(|lease| Op::Complete { lease }),
        1 => any::<u16>().prop_map(|lease| Op::CompleteWithRetention { lease }),
        1 => any::<u16>().prop_map(|lease| Op::Release { lease }),
        1 => any::<u16>().prop_map(|lease| Op::Extend { lease }),
        1 => any::<u16>().prop_map(|lease| Op::MarkNeedsReview { lease }),
        1 => (0..KEYS, any::<bool>()).prop_map(|(key, complete)| Op::Resolve { key, complete }),
        2 => (0..KEYS, any::<bool>()).prop_map(|(key, force)| Op::Expire { key, force }),
        3 => advance_ms().prop_map(|ms| Op::Advance { ms }),
        4 => any::<u8>().prop_map(|step| Op::Background { step }),
    ]
}

/// A backend under test: a fresh store for each case (nothing under its keys), its clock, and
/// its background work.
pub(crate) trait Backend {
    type Store: Reservations;
    /// A store with no record under the model's keys, reading `clock`.
    fn fresh(&mut self, case: u32, clock: &ManualClock) -> impl Future<Output = Self::Store>;
    /// Runs background step `step` (any number: the backend picks among its steps). Returns
    /// its name, for the failure messages.
    fn background(&mut self, store: &Self::Store, step: u8) -> impl Future<Output = &'static str>;
}

/// Runs `cases` random sequences on `backend`, each against a fresh store and the model.
pub(crate) fn check<B: Backend>(backend: &mut B, cases: u32, runtime: &tokio::runtime::Runtime) {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    let mut runner = TestRunner::new(Config {
        cases,
        // Each case may restart a server: no shrinking through hundreds of them.
        max_shrink_iters: 64,
        ..Config::default()
    });
    let case = std::cell::Cell::new(0);
    let backend = std::cell::RefCell::new(backend);
    let outcome = runner.run(&prop::collection::vec(op(), 1..=50), |ops| {
        case.set(case.get() + 1);
        runtime.block_on(run(&mut **backend.borrow_mut(), case.get(), &ops));
        Ok(())
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}

/// The trait's `expire` with `live`'s meaning of `force`.
fn live(force: bool) -> LiveLease {
    if force {
        LiveLease::Take
    } else {
        LiveLease::Refuse
    }
}

async fn run<B: Backend>(backend: &mut B, case: u32, ops: &[Op]) {
    let clock = ManualClock::starting_at(at(crate::model::START_MS));
    let store = backend.fresh(case, &clock).await;
    let mut model = Keys::new(crate::model::START_MS, LEASE_MS, retention_of);
    let mut leases: Vec<(usize, Lease)> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let mut context = format!("case {case} step {step} {op:?}");
        let pick = |pick: &u16| {
            (!leases.is_empty()).then(|| {
                let i = usize::from(*pick) % leases.len();
                (i, leases[i].0, leases[i].1.clone())
            })
        };
        match op {
            Op::Reserve { key, body } => {
                let expected = model.reserve(*key, model_body(*body));
                let actual = store
                    .reserve(&key_of(*key), body_of(model_body(*body)))
                    .await
                    .expect(&context);
                let (got, lease) = observed(actual);
                assert_eq!(got, expected, "{context}");
                if let Some(lease) = lease {
                    let Answer::Acquired { attempt } = expected else {
                        unreachable!()
                    };
                    assert!(lease.token() > model.max_token, "{context}: token reused");
                    assert_eq!(lease.lease_until(), at(model.now + LEASE_MS), "{context}");
                    model.max_token = lease.token();
                    model.pending(*key, model_body(*body), lease.token(), attempt);
                    leases.push((*key, lease));
                }
            }
            Op::Complete { lease } | Op::CompleteWithRetention { lease } => {
                let Some((_, key, lease)) = pick(lease) else {
                    continue;
                };
                let result = format!("result of step {step}").into_bytes();
                let retention =
                    matches!(op, Op::CompleteWithRetention { .. }).then_some(OVERRIDE_RETENTION_MS);
                let actual = match retention {
                    Some(ms) => {
                        store
                            .complete_with_retention(
                                &lease,
                                result.clone(),
                                Duration::from_millis(ms),
                            )
                            .await
                    }
                    None => store.complete(&lease, result.clone()).await,
                };
                let already = matches!(
                    model.live(key),
                    Some(Model::Completed { token, .. }) if *token == lease.token()
                );
                if already {
                    actual.expect(&context);
                } else {
                    match model.owner_check(key, lease.token()) {
                        Ok(()) => {
                            actual.expect(&context);
                            model.complete(key, result, retention);
                        }
                        Err(reason) => check_lost(actual, &lease, reason, &context),
                    }
                }
            }
            Op::Release { lease } => {
                let Some((_, key, lease)) = pick(lease) else {
                    continue;
                };
                let actual = store.release_if_pending(&lease).await;
                match model.live(key) {
                    None | Some(Model::Completed { .. }) => {
                        assert!(!actual.expect(&context), "{context}: released")
                    }
                    Some(_) => match model.owner_check(key, lease.token()) {
                        Ok(()) => {
                            assert!(actual.expect(&context), "{context}");
                            model.records.remove(&key);
                        }
                        Err(reason) => check_lost(actual, &lease, reason, &context),
                    },
                }
            }
            Op::Extend { lease: index } => {
                let Some((i, key, lease)) = pick(index) else {
                    continue;
                };
                let actual = store.extend(&lease).await;
                match model.owner_check(key, lease.token()) {
                    Ok(()) => {
                        let extended = actual.expect(&context);
                        assert_eq!(
                            extended.lease_until(),
                            at(model.now + LEASE_MS),
                            "{context}"
                        );
                        assert_eq!(extended.token(), lease.token(), "{context}");
                        model.extend(key);
                        leases[i].1 = extended;
                    }
                    Err(reason) => check_lost(actual, &lease, reason, &context),
                }
            }
            Op::MarkNeedsReview { lease } => {
                let Some((_, key, lease)) = pick(lease) else {
                    continue;
                };
                let note = format!("note of step {step}");
                let actual = store.mark_needs_review(&lease, &note).await;
                match model.owner_check(key, lease.token()) {
                    Ok(()) => {
                        actual.expect(&context);
                        model.review(key, note);
                    }
                    Err(reason) => check_lost(actual, &lease, reason, &context),
                }
            }
            Op::Resolve { key, complete } => {
                let result = format!("resolved at step {step}").into_bytes();
                let resolution = if *complete {
                    Resolution::Complete(result.clone())
                } else {
                    Resolution::Release
                };
                let actual = store.resolve(&key_of(*key), resolution).await;
                let resolvable = match model.live(*key) {
                    Some(Model::Review { .. }) => true,
                    Some(r @ Model::Pending { .. }) => !r.lease_live(model.now, model.floor),
                    _ => false,
                };
                if !resolvable {
                    assert!(
                        matches!(actual, Err(Error::NotResolvable { .. })),
                        "{context}: expected NotResolvable, got {actual:?}"
                    );
                } else {
                    actual.expect(&context);
                    if *complete {
                        let token = store
                            .get(&key_of(*key))
                            .await
                            .expect(&context)
                            .expect("a resolved key is stored")
                            .token();
                        assert!(token > model.max_token, "{context}: resolve token reused");
                        model.max_token = token;
                        model.complete(*key, result, None);
                        if let Some(Model::Completed { token: stored, .. }) =
                            model.records.get_mut(key)
                        {
                            *stored = token;
                        }
                    } else {
                        model.records.remove(key);
                    }
                }
            }
            Op::Expire { key, force } => {
                let actual = store.expire(&key_of(*key), live(*force)).await;
                let expired_in_model =
                    model.records.contains_key(key) && model.live(*key).is_none();
                let expected = model.expire(*key, *force);
                if expired_in_model {
                    // Stored or swept already: the contract leaves it open.
                    let answer = actual.expect(&context);
                    assert!(
                        matches!(answer, None | Some(RecordClass::Expired)),
                        "{context}: an expired record's expire answered {answer:?}"
                    );
                } else {
                    check_expired(actual, expected, *key, &context);
                }
            }
            Op::Advance { ms } => {
                clock.advance(Duration::from_millis(*ms));
                model.now += ms;
            }
            Op::Background { step } => {
                let name = backend.background(&store, *step).await;
                context.push_str(&format!(" ({name})"));
            }
        }
        for k in 0..KEYS {
            let actual = store.get(&key_of(k)).await.expect(&context);
            let context = format!("{context}: get key {k}");
            match (actual, model.live(k)) {
                (None, None) => {}
                (Some(actual), Some(_)) => check_record(&actual, &model, k, &context),
                (actual, expected) => {
                    panic!("{context}: store has {actual:?}, model has {expected:?}")
                }
            }
        }
    }
}

/// The local store through the trait, on simulated disks, its background work manual.
struct Local;

impl Backend for Local {
    type Store = Store;

    async fn fresh(&mut self, _case: u32, clock: &ManualClock) -> Store {
        let disks = (
            crate::support::sim::SimDisk::new(),
            crate::support::sim::SimDisk::new(),
        );
        Store::builder()
            .lease(Duration::from_millis(LEASE_MS))
            .retention(Duration::from_millis(RETENTION_MS))
            .retention_for(operation_of(1), Duration::from_millis(REFUNDS_RETENTION_MS))
            .retention_for(operation_of(2), Duration::from_millis(CONSUME_RETENTION_MS))
            .clock(clock.clone())
            .sweep_interval(None)
            .cache_records(2)
            .__manual_background()
            .open_with_storage(disks.0, disks.1)
            .expect("open the store")
    }

    async fn background(&mut self, store: &Store, step: u8) -> &'static str {
        use idemstore::whitebox::Background;
        let all = Background::ALL;
        match all.get(usize::from(step) % (all.len() + 1)) {
            Some(step) => {
                store.__background(*step).expect("a background step");
                "engine step"
            }
            None => {
                Reservations::sweep(store, usize::from(step % 3))
                    .await
                    .expect("sweep");
                "sweep"
            }
        }
    }
}

#[test]
fn the_local_store_through_the_trait_matches_the_model_whatever_its_background_work_did() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    check(&mut Local, 64, &runtime);
}

/// PostgreSQL: each case its own table on one throwaway server, killed and restarted now and
/// then.
#[cfg(feature = "postgres")]
mod on_postgres {
    use super::*;
    use crate::postgres::server::Server;
    use idemstore::PgStore;

    struct Pg {
        server: Server,
    }

    impl Backend for Pg {
        type Store = PgStore;

        async fn fresh(&mut self, case: u32, clock: &ManualClock) -> PgStore {
            PgStore::builder()
                .table(format!("model_case_{case}"))
                .lease(Duration::from_millis(LEASE_MS))
                .retention(Duration::from_millis(RETENTION_MS))
                .retention_for(operation_of(1), Duration::from_millis(REFUNDS_RETENTION_MS))
                .retention_for(operation_of(2), Duration::from_millis(CONSUME_RETENTION_MS))
                .clock(clock.clone())
                .connect(&self.server.config())
                .await
                .expect("connect to the test server")
        }

        async fn background(&mut self, store: &PgStore, step: u8) -> &'static str {
            if step.is_multiple_of(8) {
                // Between two operations: no operation is in flight, so none is ambiguous.
                self.server.kill();
                self.server.restart();
                reconnected(store).await;
                "server killed and restarted"
            } else {
                store.sweep(usize::from(step % 4)).await.expect("sweep");
                "sweep"
            }
        }
    }

    #[test]
    fn postgres_matches_the_model_across_sweeps_and_server_restarts() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut backend = Pg {
            server: Server::start(),
        };
        check(&mut backend, 24, &runtime);
    }
}

/// etcd: each case its own prefix on one three-member cluster, a member killed and restarted
/// now and then.
#[cfg(feature = "etcd")]
mod on_etcd {
    use super::*;
    use crate::etcd::cluster::Cluster;
    use idemstore::EtcdStore;

    struct Etcd {
        cluster: Cluster,
    }

    impl Backend for Etcd {
        type Store = EtcdStore;

        async fn fresh(&mut self, case: u32, clock: &ManualClock) -> EtcdStore {
            EtcdStore::builder()
                .prefix(format!("model/{case}/"))
                .lease(Duration::from_millis(LEASE_MS))
                .retention(Duration::from_millis(RETENTION_MS))
                .retention_for(operation_of(1), Duration::from_millis(REFUNDS_RETENTION_MS))
                .retention_for(operation_of(2), Duration::from_millis(CONSUME_RETENTION_MS))
                .clock(clock.clone())
                .connect(&self.cluster.endpoints())
                .await
                .expect("connect to the test cluster")
        }

        async fn background(&mut self, store: &EtcdStore, step: u8) -> &'static str {
            if step.is_multiple_of(8) {
                let member = usize::from(step / 8) % 3;
                // On a thread of its own: the cluster's helpers run a runtime of their own.
                let cluster = &mut self.cluster;
                std::thread::scope(|s| {
                    s.spawn(|| {
                        cluster.kill(member);
                        cluster.restart(member);
                    });
                });
                reconnected(store).await;
                "member killed and restarted"
            } else {
                store.sweep(usize::from(step % 4)).await.expect("sweep");
                "sweep"
            }
        }
    }

    #[test]
    fn etcd_matches_the_model_across_sweeps_and_member_restarts() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut backend = Etcd {
            cluster: Cluster::start(),
        };
        check(&mut backend, 24, &runtime);
    }
}

/// Waits until `store` answers again after its server came back: connections the restart
/// broke fail once (before any statement reaches the new server) and are replaced.
#[cfg(any(feature = "postgres", feature = "etcd"))]
async fn reconnected(store: &impl Reservations) {
    let probe = key_of(0);
    for _ in 0..200 {
        if store.get(&probe).await.is_ok() {
            // Every pooled connection the restart broke is found by a read, not by the
            // sequence's next write.
            let mut ok = 0;
            for _ in 0..64 {
                if store.get(&probe).await.is_ok() {
                    ok += 1;
                }
            }
            if ok == 64 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the store did not answer within 10 s of its server's restart");
}
