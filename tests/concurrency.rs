//! Many threads racing on one store: exactly one acquisition per key per lease generation,
//! everyone else told "in progress" or handed the winner's own result, never another key's;
//! distinct keys all acquire with distinct tokens.

use std::collections::{HashMap, HashSet};
use std::sync::{Barrier, Mutex};
use std::thread;

use idemstore::{Error, Key, Lease, LeaseLostReason, Reservation};

use crate::common::{acquire, fp, key, Env, LEASE};

const THREADS: usize = 16;

fn racing_keys() -> Vec<Key> {
    // The same id under three scopes and one other id: a mix-up would show.
    vec![
        key("user-a", "charge", "k1"),
        key("user-b", "charge", "k1"),
        key("user-c", "charge", "k1"),
        key("user-a", "charge", "k2"),
    ]
}

/// Every thread reserves every key (each thread in its own order) at the same moment:
/// per key exactly one thread acquires; the others see InProgress for that attempt. Then
/// the leases run out and the race is run again: again exactly one takeover per key
/// (attempt 2, a new token). The winners complete with results unique to them, and a third
/// race sees only the result of that key's winner. The first generation's winners are
/// fenced off.
#[test]
fn one_acquisition_per_key_per_lease_generation() {
    let env = Env::new();
    let store = env.open();
    let keys = racing_keys();
    let body = fp("same request");

    // One race: returns, per key, the leases won and the other outcomes seen.
    let race = || -> HashMap<Key, (Vec<Lease>, Vec<Reservation>)> {
        let barrier = Barrier::new(THREADS);
        let seen = Mutex::new(HashMap::<Key, (Vec<Lease>, Vec<Reservation>)>::new());
        thread::scope(|s| {
            for t in 0..THREADS {
                let (store, keys, barrier, seen) = (&store, &keys, &barrier, &seen);
                s.spawn(move || {
                    barrier.wait();
                    for i in 0..keys.len() {
                        let k = &keys[(i + t) % keys.len()];
                        let outcome = store.reserve(k, body).expect("reserve");
                        let mut seen = seen.lock().unwrap();
                        let entry = seen.entry(k.clone()).or_default();
                        match outcome {
                            Reservation::Acquired(lease) => entry.0.push(lease),
                            other => entry.1.push(other),
                        }
                    }
                });
            }
        });
        seen.into_inner().unwrap()
    };

    let mut first_winners = HashMap::new();
    for generation in 1..=2u32 {
        let seen = race();
        assert_eq!(seen.len(), keys.len());
        for k in &keys {
            let (won, others) = &seen[k];
            assert_eq!(
                won.len(),
                1,
                "generation {generation}: exactly one winner for {k}, got {won:?}"
            );
            assert_eq!(won[0].key(), k);
            assert_eq!(won[0].attempt(), generation);
            assert_eq!(others.len(), THREADS - 1);
            for other in others {
                assert!(
                    matches!(other, Reservation::InProgress { retry_after, attempt }
                        if *retry_after <= LEASE && *attempt == generation),
                    "generation {generation}, {k}: {other:?}"
                );
            }
        }
        let tokens: HashSet<u64> = seen.values().map(|(won, _)| won[0].token()).collect();
        assert_eq!(tokens.len(), keys.len(), "tokens are distinct");
        if generation == 1 {
            first_winners = seen
                .into_iter()
                .map(|(k, (won, _))| (k, won[0].clone()))
                .collect();
            env.advance(LEASE);
        } else {
            for k in &keys {
                let winner = &seen[k].0[0];
                assert!(winner.token() > first_winners[k].token());
                store
                    .complete(winner, format!("{k} by token {}", winner.token()))
                    .unwrap();
            }
            // The first generation's winners lost their keys.
            for k in &keys {
                match store.complete(&first_winners[k], b"stale".to_vec()) {
                    Err(Error::LeaseLost { reason, .. }) => assert_eq!(
                        reason,
                        LeaseLostReason::Completed {
                            by_token: seen[k].0[0].token()
                        }
                    ),
                    other => panic!("{k}: expected LeaseLost, got {other:?}"),
                }
            }
            let expected: HashMap<Key, Vec<u8>> = seen
                .iter()
                .map(|(k, (won, _))| {
                    (
                        k.clone(),
                        format!("{k} by token {}", won[0].token()).into_bytes(),
                    )
                })
                .collect();
            let third = race();
            for k in &keys {
                let (won, others) = &third[k];
                assert!(won.is_empty(), "{k} was acquired again: {won:?}");
                for other in others {
                    match other {
                        Reservation::Completed(done) => {
                            assert_eq!(done.result, expected[k], "{k} got another result");
                            assert_eq!(done.attempt, 2);
                        }
                        other => panic!("{k}: expected the stored result, got {other:?}"),
                    }
                }
            }
        }
    }
}

/// Free-running: every thread loops over the keys, completing immediately whatever it wins
/// with a result naming the key and itself. With the clock still, each key is acquired
/// exactly once in total, and every outcome seen is InProgress or exactly the result that
/// key's winner stored: nobody ever sees another key's (or another winner's) result.
#[test]
fn racing_duplicates_see_only_their_own_keys_winner_result() {
    let env = Env::new();
    let store = env.open();
    let keys = racing_keys();
    let body = fp("same request");
    let barrier = Barrier::new(THREADS);
    let winners = Mutex::new(HashMap::<Key, Vec<(usize, u64)>>::new());
    let replays = Mutex::new(Vec::<(Key, Vec<u8>)>::new());

    thread::scope(|s| {
        for t in 0..THREADS {
            let (store, keys, barrier, winners, replays) =
                (&store, &keys, &barrier, &winners, &replays);
            s.spawn(move || {
                barrier.wait();
                for round in 0..8 {
                    let k = &keys[(round + t) % keys.len()];
                    match store.reserve(k, body).expect("reserve") {
                        Reservation::Acquired(lease) => {
                            winners
                                .lock()
                                .unwrap()
                                .entry(k.clone())
                                .or_default()
                                .push((t, lease.token()));
                            let result = format!("{k} won by thread {t} with {}", lease.token());
                            store.complete(&lease, result).expect("complete");
                        }
                        Reservation::Completed(done) => {
                            replays.lock().unwrap().push((k.clone(), done.result))
                        }
                        Reservation::InProgress { attempt, .. } => assert_eq!(attempt, 1),
                        other => panic!("{k}: unexpected {other:?}"),
                    }
                }
            });
        }
    });

    let winners = winners.into_inner().unwrap();
    let mut expected = HashMap::new();
    for k in &keys {
        let won = &winners[k];
        assert_eq!(won.len(), 1, "{k} acquired more than once: {won:?}");
        let (thread, token) = won[0];
        expected.insert(
            k.clone(),
            format!("{k} won by thread {thread} with {token}").into_bytes(),
        );
    }
    let replays = replays.into_inner().unwrap();
    assert!(
        !replays.is_empty(),
        "some duplicates arrive after completion"
    );
    for (k, result) in replays {
        assert_eq!(
            result,
            expected[&k],
            "{k} replayed {}",
            String::from_utf8_lossy(&result)
        );
    }
    // After everyone is done, each key replays its own winner's result.
    for k in &keys {
        let done = crate::common::replayed(&store, k, body);
        assert_eq!(done.result, expected[k]);
    }
}

/// Concurrent reserves of distinct keys all acquire (attempt 1), with tokens all distinct;
/// the tokens handed out after a reopen are above all of them.
#[test]
fn concurrent_reserves_of_distinct_keys_all_acquire_with_distinct_tokens() {
    const PER_THREAD: usize = 20;
    let env = Env::new();
    let store = env.open();
    let barrier = Barrier::new(THREADS);
    let leases = Mutex::new(Vec::new());
    thread::scope(|s| {
        for t in 0..THREADS {
            let (store, barrier, leases) = (&store, &barrier, &leases);
            s.spawn(move || {
                barrier.wait();
                for i in 0..PER_THREAD {
                    let k = key(&format!("tenant-{t}"), "op", &format!("id-{i}"));
                    let lease = acquire(store, &k, fp("b"));
                    assert_eq!(lease.key(), &k);
                    assert_eq!(lease.attempt(), 1);
                    // Half of them complete concurrently with the others' reserves.
                    if i % 2 == 0 {
                        store.complete(&lease, k.to_string()).expect("complete");
                    }
                    leases.lock().unwrap().push(lease);
                }
            });
        }
    });
    let leases = leases.into_inner().unwrap();
    assert_eq!(leases.len(), THREADS * PER_THREAD);
    let tokens: HashSet<u64> = leases.iter().map(Lease::token).collect();
    assert_eq!(tokens.len(), leases.len(), "every token is distinct");
    let max = *tokens.iter().max().unwrap();

    for lease in &leases {
        let record = store.get(lease.key()).unwrap().expect("stored");
        assert_eq!(record.token(), lease.token(), "{}", lease.key());
    }
    drop(store);
    let store = env.open();
    let after = acquire(&store, &key("tenant-x", "op", "after reopen"), fp("b"));
    assert!(after.token() > max);
}
