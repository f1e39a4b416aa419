//! The concurrent power-loss model: several threads reserve, complete, release, extend, abandon
//! (so leases go stale and are taken over), expire keys they do not hold (forced or not), and
//! sweep on one store on simulated disks while the
//! clock moves; at a random moment the power is cut, sometimes while syncs are held so that
//! several frames are in flight. The images keep, lose or tear each unsynced write of the log
//! and of the redb file. After every cut the store must open and:
//!
//! - every acknowledged operation is there (per key, the acknowledged state of the highest
//!   acknowledged token, allowing only what unacknowledged operations could have changed);
//! - no token is reused: every acknowledged acquisition has a token never acknowledged before,
//!   above every token acknowledged before the cut;
//! - no key ever had two live owners: an acquisition never falls inside another lease's
//!   acknowledged live interval (from its acquisition or an acknowledged extend to its lease
//!   deadline, cut short when its holder asks to complete or release, and at the latest when
//!   the next store opens: leases end with their process);
//! - every key found pending after the cut is stale at once: [`Store::stale`] lists exactly
//!   those keys, and the first reserve of each is `Acquired` with attempt + 1.
//!
//! [`CUTS`]: `cargo test` (a debug build) runs 150 cuts (two lineages of stores in
//! parallel), a release build (CI's `release` step) 1,000, `IDEMSTORE_LONG=1` 10,000, and
//! `IDEMSTORE_POWER_CUTS=<n>` any number. `IDEMSTORE_POWER_SEED=<n>`
//! repeats a run's random choices of operations and images (thread timing still varies).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::support::sim::{Rng, SimDisk};
use idemstore::whitebox::to_millis;
use idemstore::whitebox::Millis;
use idemstore::{Builder, Fingerprint, Key, Lease, ManualClock, Reservation, Status, Store};

/// Cuts in `cargo test` (a debug build), in a release build (CI's `release` step) and in
/// the long mode.
const CUTS: [usize; 3] = [150, 1_000, 10_000];
const THREADS: usize = 3;
const KEYS: usize = 10;
const LEASE_MS: u64 = 1_000;
const RETENTION_MS: u64 = 2_000;

fn cuts() -> usize {
    if let Some(n) = std::env::var("IDEMSTORE_POWER_CUTS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    let [smoke, full, long] = CUTS;
    crate::common::by_mode(smoke, full, long)
}

fn builder(clock: &ManualClock) -> Builder {
    let mut builder = Store::builder();
    builder
        .clock(clock.clone())
        .lease(Duration::from_millis(LEASE_MS))
        .retention(Duration::from_millis(RETENTION_MS))
        .checkpoint_bytes(16 * 1024)
        .checkpoint_interval(Duration::from_millis(30))
        .sweep_interval(Some(Duration::from_millis(20)))
        .verify_on_open(false)
        .cache_records(8);
    builder
}

fn key(i: usize) -> Key {
    Key::new("tenant", "op", format!("key-{i}")).unwrap()
}

fn fingerprint(i: usize) -> Fingerprint {
    Fingerprint::of(format!("request for key {i}").as_bytes())
}

fn result_for(token: u64) -> Vec<u8> {
    let mut result = format!("done by token {token};").into_bytes();
    result.resize(300, b'.');
    result
}

/// What is known of one lease (by token).
#[derive(Debug, Clone)]
struct LeaseLog {
    key: usize,
    /// Acknowledged live intervals: from each acknowledged acquisition or extend (its decision
    /// time) to its lease deadline.
    live: Vec<(Millis, Millis)>,
    /// When its holder first asked to complete or release it (a lower bound of when that was
    /// decided): its live intervals end there.
    ending_from: Option<Millis>,
    /// The result of a completion asked for (acknowledged or not).
    completing: Option<Vec<u8>>,
    /// The last acknowledged state.
    state: Acked,
}

#[derive(Debug, Clone, PartialEq)]
enum Acked {
    Pending { lease_until: Millis },
    Completed { result: Vec<u8>, expires_at: Millis },
    Released,
}

/// Everything acknowledged, across every cut of one lineage.
#[derive(Default)]
struct History {
    leases: HashMap<u64, LeaseLog>,
    /// Every acknowledged acquisition's token.
    tokens: HashSet<u64>,
    max_token: u64,
    /// Acknowledged acquisitions, of them takeovers of a stale lease, completions, releases,
    /// extends and expires that removed a record.
    counts: [u64; 6],
    /// Per key, the clock when an expire that may have removed its record (it answered so,
    /// or failed, so its frame may still have reached the log) last returned: a lease
    /// acquired (decided) at or before then may have been removed by it, whatever order the
    /// threads recorded their acknowledgments in, and whether or not the power was cut.
    expired_at: HashMap<usize, Millis>,
    /// Per key, expires asked and not returned (a worker that panicked after the cut).
    expiring: HashMap<usize, u32>,
    /// Per key, forced expires: when each was asked and when it returned (`None` while in
    /// flight). One decided at some moment in between ends any live lease of the key.
    forced: HashMap<usize, Vec<(Millis, Option<Millis>)>>,
    /// Acknowledged operations since the store was opened.
    acked: u64,
    /// The highest token acknowledged before the current store was opened.
    before_open: u64,
    /// The power was cut: acknowledgments from now on are not counted (their sync may have
    /// been dropped by the frozen disk).
    cut: bool,
}

impl History {
    fn acquired(&mut self, i: usize, lease: &Lease) {
        if self.cut {
            return;
        }
        let token = lease.token();
        let until = to_millis(lease.lease_until());
        self.acked += 1;
        self.counts[0] += 1;
        self.counts[1] += u64::from(lease.is_retry());
        assert!(self.tokens.insert(token), "token {token} handed out twice");
        self.max_token = self.max_token.max(token);
        assert!(
            token > self.before_open,
            "token {token} is not above {} acknowledged before the last power cut",
            self.before_open
        );
        self.leases.insert(
            token,
            LeaseLog {
                key: i,
                live: vec![(until - LEASE_MS, until)],
                ending_from: None,
                completing: None,
                state: Acked::Pending { lease_until: until },
            },
        );
        self.check_owners(token);
    }

    fn extended(&mut self, token: u64, lease_until: Millis) {
        if self.cut {
            return;
        }
        let Some(log) = self.leases.get_mut(&token) else {
            return;
        };
        self.acked += 1;
        self.counts[4] += 1;
        log.live.push((lease_until - LEASE_MS, lease_until));
        log.state = Acked::Pending { lease_until };
        self.check_owners(token);
    }

    fn ending(&mut self, token: u64, now: Millis, result: Option<&[u8]>) {
        let Some(log) = self.leases.get_mut(&token) else {
            return; // acquired after the cut: not recorded
        };
        log.ending_from.get_or_insert(now);
        if let Some(result) = result {
            log.completing = Some(result.to_vec());
        }
    }

    fn ended(&mut self, token: u64, state: Acked) {
        if self.cut {
            return;
        }
        if let Some(log) = self.leases.get_mut(&token) {
            self.acked += 1;
            self.counts[if matches!(state, Acked::Released) {
                3
            } else {
                2
            }] += 1;
            log.state = state;
        }
    }

    /// An expire of key `i` that removed a record was acknowledged. A plain expire never
    /// removes a live lease, so no live interval ends here.
    /// An expire of key `i` is asked at `now`; returns its place among the forced ones.
    fn expiring(&mut self, i: usize, now: Millis, force: bool) -> Option<usize> {
        *self.expiring.entry(i).or_default() += 1;
        force.then(|| {
            let forced = self.forced.entry(i).or_default();
            forced.push((now, None));
            forced.len() - 1
        })
    }

    /// An expire of key `i` returned at `now`; `removed`: it may have removed a record.
    fn expired(&mut self, i: usize, now: Millis, removed: bool, forced: Option<usize>) {
        if let Some(n) = self.expiring.get_mut(&i) {
            *n -= 1;
        }
        if let Some(f) = forced {
            self.forced.get_mut(&i).expect("asked")[f].1 = Some(now);
        }
        if removed {
            let at = self.expired_at.entry(i).or_insert(now);
            *at = (*at).max(now);
            if !self.cut {
                self.acked += 1;
                self.counts[5] += 1;
            }
        }
    }

    /// Whether the lease `token` of key `i`, whose holder saw it live until `lease_until`, may
    /// have been lost by `now` without a bug: it ran out (another caller may have taken it
    /// over, or a sweep or an expire removed it), or a forced expire of its key was asked
    /// after it was acquired. An acquisition not recorded (after the cut) may have been too.
    fn may_have_lost(&self, i: usize, token: u64, lease_until: Millis, now: Millis) -> bool {
        let Some(log) = self.leases.get(&token) else {
            return true;
        };
        let acquired_at = log.live[0].0;
        now >= lease_until
            || self.forced.get(&i).is_some_and(|forced| {
                forced
                    .iter()
                    .any(|&(_, returned)| returned.is_none_or(|r| r >= acquired_at))
            })
    }

    /// No acquisition falls inside another lease's acknowledged live interval: checks the
    /// lease `token` (just acquired or extended) against every other lease of its key.
    fn check_owners(&self, token: u64) {
        let l = &self.leases[&token];
        let forced = self.forced.get(&l.key).map_or(&[][..], Vec::as_slice);
        // A forced expire decided between its asking and its return may end an interval from
        // the later of its asking and the interval's start.
        let forced_end = |from: Millis| {
            forced
                .iter()
                .filter(|(_, returned)| returned.is_none_or(|r| r >= from))
                .map(|&(asked, _)| asked.max(from))
                .min()
        };
        let live = |lease: &LeaseLog| -> Vec<(Millis, Millis)> {
            lease
                .live
                .iter()
                .map(|&(from, until)| {
                    let until = lease.ending_from.map_or(until, |e| until.min(e));
                    (from, forced_end(from).map_or(until, |f| until.min(f)))
                })
                .collect()
        };
        for (&other, o) in self.leases.iter().filter(|(_, o)| o.key == l.key) {
            let (earlier, later) = match other.cmp(&token) {
                std::cmp::Ordering::Less => ((other, o), (token, l)),
                std::cmp::Ordering::Greater => ((token, l), (other, o)),
                std::cmp::Ordering::Equal => continue,
            };
            let acquired_at = later.1.live[0].0;
            for (from, until) in live(earlier.1) {
                assert!(
                    !(from <= acquired_at && acquired_at < until),
                    "key {}: token {} acquired at {acquired_at} while token {} was live from {from} to {until}",
                    l.key, later.0, earlier.0
                );
            }
        }
    }

    /// Forgets leases that ended long before `now` (they can no longer conflict with a new
    /// acquisition), keeping the newest of each key for [`verify`](History::verify).
    fn prune(&mut self, now: Millis) {
        let mut newest: HashMap<usize, u64> = HashMap::new();
        for (&t, l) in &self.leases {
            let e = newest.entry(l.key).or_insert(t);
            *e = (*e).max(t);
        }
        self.leases.retain(|t, l| {
            newest.get(&l.key) == Some(t)
                || l.live.iter().any(|&(_, until)| until + 10 * LEASE_MS > now)
        });
        // An expire that never returned (its worker panicked after the cut) was decided, if
        // at all, before this reopen.
        for (&i, n) in &mut self.expiring {
            if *n > 0 {
                let at = self.expired_at.entry(i).or_insert(now);
                *at = (*at).max(now);
                *n = 0;
            }
        }
        for forced in self.forced.values_mut() {
            for (_, returned) in forced.iter_mut() {
                returned.get_or_insert(now);
            }
            forced.retain(|&(_, returned)| returned.is_some_and(|r| r + 10 * LEASE_MS > now));
        }
    }

    /// The store was opened again at `now`: every lease granted before ended with the owner
    /// that granted it (the default, `leases_survive_restart(false)`).
    fn owner_gone(&mut self, now: Millis) {
        for log in self.leases.values_mut() {
            for (_, until) in &mut log.live {
                *until = (*until).min(now);
            }
        }
    }

    /// After reopening at `now`: every key holds what was acknowledged.
    fn verify(&self, store: &Store, now: Millis) {
        for i in 0..KEYS {
            let Some((&token, log)) = self
                .leases
                .iter()
                .filter(|(_, l)| l.key == i)
                .max_by_key(|(t, _)| **t)
            else {
                continue;
            };
            let record = store.get(&key(i)).unwrap();
            let got = record.as_ref().map(|r| (r.token(), r.status()));
            let fail = || -> ! {
                panic!("key {i} after a power cut at {now}: acknowledged token {token} {log:?}, found {got:?}")
            };
            let acquired_at = log.live[0].0;
            let maybe_expired = self.expired_at.get(&i).is_some_and(|&t| acquired_at <= t)
                || self.expiring.get(&i).is_some_and(|&n| n > 0);
            if maybe_expired && got.as_ref().is_none_or(|(t, _)| *t > token) {
                continue;
            }
            match &log.state {
                Acked::Completed { result, expires_at } => match got {
                    Some((t, Status::Completed { result: r, .. })) if t == token => {
                        if r != result.as_slice() {
                            fail()
                        }
                    }
                    Some((t, _)) if t > token && now >= *expires_at => {}
                    None if now >= *expires_at => {}
                    _ => fail(),
                },
                Acked::Released => match got {
                    None => {}
                    Some((t, _)) if t > token => {}
                    _ => fail(),
                },
                Acked::Pending { lease_until } => match got {
                    Some((t, Status::Pending { lease_until: u, .. })) if t == token => {
                        if to_millis(u) < *lease_until {
                            fail()
                        }
                    }
                    Some((t, Status::Completed { result: r, .. })) if t == token => {
                        if log.completing.as_deref() != Some(r) {
                            fail()
                        }
                    }
                    // Taken over once stale, or released (unacknowledged) and taken again.
                    Some((t, _)) if t > token => {
                        if now < *lease_until && log.ending_from.is_none() {
                            fail()
                        }
                    }
                    None if now >= lease_until + RETENTION_MS || log.ending_from.is_some() => {}
                    _ => fail(),
                },
            }
        }
    }
}

/// One worker: random operations on random keys until `stop`.
fn worker(
    store: &Store,
    clock: &ManualClock,
    history: &Mutex<History>,
    stop: &AtomicBool,
    seed: u64,
) {
    // After the cut the disks are frozen: redb may read back pages whose writes were dropped
    // and fail in any way. Only a failure before the cut counts.
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        work(store, clock, history, stop, seed)
    }));
    if let Err(panic) = run {
        if !history.lock().cut {
            std::panic::resume_unwind(panic);
        }
    }
}

/// Fails the test on an answer that only a bug explains, given before the power cut: an
/// error the operation cannot meet on a healthy store (a poisoned store, a failed read...),
/// or a lease lost while it was live and no forced expire was asked. After the cut the
/// disks are frozen and anything may fail.
#[track_caller]
fn expect_before_cut(
    history: &Mutex<History>,
    what: &str,
    answer: std::fmt::Arguments<'_>,
    explained: impl FnOnce(&History) -> bool,
) {
    let h = history.lock();
    if h.cut || explained(&h) {
        return;
    }
    drop(h);
    panic!("{what} before the power cut: {answer}");
}

fn work(
    store: &Store,
    clock: &ManualClock,
    history: &Mutex<History>,
    stop: &AtomicBool,
    seed: u64,
) {
    let mut rng = Rng(seed | 1);
    let mut held: HashMap<usize, Lease> = HashMap::new();
    let now = || to_millis(clock.time());
    // No operation starts once the cut is marked: an acquisition acknowledged after the mark
    // is not recorded, and its holder could otherwise take over a stale key and release or
    // expire it before the disks freeze, which the history cannot know about (it showed as an
    // acknowledged stale reservation "found None").
    while !stop.load(Ordering::Relaxed) && !history.lock().cut {
        let i = (rng.next() % KEYS as u64) as usize;
        let choice = rng.next() % 16;
        let Some(lease) = held.get(&i).cloned() else {
            if choice == 0 {
                if let Err(e) = store.sweep(4) {
                    expect_before_cut(history, "a sweep failed", format_args!("{e}"), |_| false);
                }
                continue;
            }
            // Rarely, so that most keys keep their acknowledged state to be checked.
            if choice == 1 && rng.next().is_multiple_of(16) {
                let force = rng.next().is_multiple_of(2);
                let asked_at = now();
                let forced = history.lock().expiring(i, asked_at, force);
                let answer = if force {
                    store.expire_forced(&key(i))
                } else {
                    store.expire(&key(i))
                };
                let removed = !matches!(answer, Ok(None) | Err(idemstore::Error::LeaseLive { .. }));
                let returned_at = now();
                history.lock().expired(i, returned_at, removed, forced);
                match answer {
                    Ok(_) => {}
                    Err(idemstore::Error::LeaseLive { .. }) if !force => {}
                    Err(e) => expect_before_cut(
                        history,
                        &format!("an expire of key {i} (forced: {force}) failed"),
                        format_args!("{e}"),
                        |_| false,
                    ),
                }
                continue;
            }
            match store.reserve(&key(i), fingerprint(i)) {
                Ok(Reservation::Acquired(lease)) => {
                    history.lock().acquired(i, &lease);
                    held.insert(i, lease);
                }
                Ok(_) => {}
                Err(e) => {
                    let what = format!("a reserve of key {i} failed");
                    expect_before_cut(history, &what, format_args!("{e}"), |_| false);
                    return; // after the cut: the store is going away
                }
            }
            continue;
        };
        let token = lease.token();
        let until = to_millis(lease.lease_until());
        // An operation on the lease that failed: only a lost lease (run out, or a forced
        // expire since it was acquired) explains `LeaseLost` before the cut.
        let lost = |what: &str, answer: Result<bool, idemstore::Error>| {
            let returned = now();
            let explained = |h: &History| match &answer {
                Err(idemstore::Error::LeaseLost { .. }) | Ok(false) => {
                    h.may_have_lost(i, token, until, returned)
                }
                _ => false,
            };
            let what = format!(
                "{what} of key {i} with live token {token} (lease until {until}, now {returned})"
            );
            expect_before_cut(history, &what, format_args!("{answer:?}"), explained);
        };
        match choice {
            0..=6 => {
                let result = result_for(token);
                let asked_at = now();
                history.lock().ending(token, asked_at, Some(&result));
                held.remove(&i);
                match store.complete(&lease, result.clone()) {
                    Ok(_) => {
                        // A lower bound of the retention deadline (decided at or after asking).
                        let expires_at = asked_at + RETENTION_MS;
                        history
                            .lock()
                            .ended(token, Acked::Completed { result, expires_at });
                    }
                    Err(e) => lost("a complete", Err(e)),
                }
            }
            7..=9 => {
                history.lock().ending(token, now(), None);
                held.remove(&i);
                match store.release_if_pending(&lease) {
                    Ok(true) => history.lock().ended(token, Acked::Released),
                    answer => lost("a release", answer),
                }
            }
            10..=13 => match store.extend(&lease) {
                Ok(renewed) => {
                    history
                        .lock()
                        .extended(token, to_millis(renewed.lease_until()));
                    held.insert(i, renewed);
                }
                Err(e) => {
                    held.remove(&i);
                    lost("an extend", Err(e));
                }
            },
            // Abandon it: it goes stale and someone takes it over.
            _ => {
                held.remove(&i);
            }
        }
    }
}

/// Right after an open: every key found pending was acquired by the owner before the cut, so
/// it is stale at once ([`Store::stale`] lists exactly those), and its first reserve takes it
/// over with attempt + 1. Each takeover is recorded (so no later acquisition may fall inside
/// it) and then released.
fn take_over_pending(store: &Store, history: &Mutex<History>, covered: &[AtomicU64; 11]) {
    let pending: Vec<(usize, u32)> = (0..KEYS)
        .filter_map(|i| {
            let record = store.get(&key(i)).unwrap()?;
            matches!(record.status(), Status::Pending { .. }).then(|| (i, record.attempt()))
        })
        .collect();
    let mut stale: Vec<Key> = store
        .stale(KEYS + 1)
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let mut expected: Vec<Key> = pending.iter().map(|&(i, _)| key(i)).collect();
    stale.sort_by(|a, b| a.id().cmp(b.id()));
    expected.sort_by(|a, b| a.id().cmp(b.id()));
    assert_eq!(stale, expected, "stale() right after the open");
    for (i, attempt) in pending {
        let lease = match store.reserve(&key(i), fingerprint(i)).unwrap() {
            Reservation::Acquired(lease) => lease,
            other => panic!("key {i} was pending before the cut; its first reserve got {other:?}"),
        };
        assert_eq!(
            lease.attempt(),
            attempt + 1,
            "key {i}: attempt after the cut"
        );
        covered[8].fetch_add(1, Ordering::Relaxed);
        let mut h = history.lock();
        h.acquired(i, &lease);
        h.ending(
            lease.token(),
            to_millis(lease.lease_until()) - LEASE_MS,
            None,
        );
        drop(h);
        assert!(store.release_if_pending(&lease).unwrap());
        history.lock().ended(lease.token(), Acked::Released);
    }
}

/// One lineage of stores: `cuts` rounds of concurrent work, each ended by a power cut.
fn lineage(cuts: usize, seed: u64, covered: &[AtomicU64; 11]) {
    let clock = ManualClock::starting_at(UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    let mut rng = Rng(seed | 1);
    let (mut db, mut log) = (SimDisk::new(), SimDisk::new());
    let history = Mutex::new(History::default());
    for cut in 0..cuts {
        let store = match builder(&clock).__open_unchecked(db.clone(), log.clone()) {
            Ok(store) => store,
            Err(e) => panic!("lineage {seed}, cut {cut}: the store does not open: {e}"),
        };
        {
            let mut history = history.lock();
            history.verify(&store, to_millis(clock.time()));
            history.before_open = history.max_token;
            history.prune(to_millis(clock.time()));
            history.cut = false;
            history.acked = 0;
            history.owner_gone(to_millis(clock.time()));
        }
        take_over_pending(&store, &history, covered);
        let cut_after = 1 + rng.next() % 10;
        let stop = AtomicBool::new(false);
        let hold = rng.next().is_multiple_of(2);
        // One cut in four comes while the store file's syncs stop completing: a background
        // checkpoint's durable commit is then in progress at the cut (the writer went on
        // logging into the other region).
        let hold_db = rng.next().is_multiple_of(4);
        if hold_db {
            db.hold_syncs();
        }
        let run_for = Duration::from_millis(50);
        thread::scope(|s| {
            for _ in 0..THREADS {
                let (store, clock, history, stop) = (&store, &clock, &history, &stop);
                let seed = rng.next();
                s.spawn(move || worker(store, clock, history, stop, seed));
            }
            // The clock moves while the workers run: leases go stale, records expire. The cut
            // comes after a random number of acknowledged operations (or some time).
            let start = Instant::now();
            while start.elapsed() < run_for && history.lock().acked < cut_after {
                clock.advance(Duration::from_millis(rng.next() % 40));
                thread::sleep(Duration::from_micros(50));
            }
            if hold_db {
                // Until a checkpoint's commit waits at the store file's sync (one starts 30 ms
                // after the open at the latest once anything is logged), and a few operations
                // more are acknowledged from the other log region.
                let held_at = Instant::now();
                let mut acked_at_commit = None;
                while held_at.elapsed() < Duration::from_millis(80) {
                    let acked = history.lock().acked;
                    match acked_at_commit {
                        None if db.syncs_waiting() > 0 => acked_at_commit = Some(acked),
                        Some(at) if acked >= at + 3 => break,
                        _ => {}
                    }
                    clock.advance(Duration::from_millis(rng.next() % 40));
                    thread::sleep(Duration::from_micros(50));
                }
            }
            if hold {
                // Syncs stop completing: batches pile up unsynced, frames in flight.
                log.hold_syncs();
                let held_at = Instant::now();
                while log.unsynced_writes() < 3 && held_at.elapsed() < Duration::from_millis(3) {
                    clock.advance(Duration::from_millis(rng.next() % 40));
                    thread::sleep(Duration::from_micros(20));
                }
            }
            history.lock().cut = true;
            // The log first: a redb commit after the log stopped can only add state, never
            // remove what the log made durable.
            log.freeze();
            db.freeze();
            covered[9].fetch_add(u64::from(db.syncs_waiting() > 0), Ordering::Relaxed);
            // Ended expiry windows deleted whole since the open: their deletion is in the
            // images this cut leaves (committed, or in flight, or not yet durable).
            covered[10].fetch_add(
                u64::from(store.stats().windows_deleted > 0),
                Ordering::Relaxed,
            );
            let in_flight = log.unsynced_writes() as u64;
            covered[0].fetch_add(in_flight, Ordering::Relaxed);
            covered[1].fetch_add(u64::from(in_flight >= 2), Ordering::Relaxed);
            let images = (
                db.after_power_loss(&mut rng),
                log.after_power_loss(&mut rng),
            );
            stop.store(true, Ordering::Relaxed);
            log.release_syncs();
            db.release_syncs();
            (db, log) = images;
        });
        drop(store);
    }
    // A last open checks the last cut.
    let store = builder(&clock)
        .__open_unchecked(db.clone(), log.clone())
        .unwrap();
    let history = history.lock();
    history.verify(&store, to_millis(clock.time()));
    for (c, n) in covered[2..8].iter().zip(history.counts) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

#[test]
fn concurrent_work_survives_power_cuts_with_frames_in_flight() {
    let cuts = cuts();
    let seed = std::env::var("IDEMSTORE_POWER_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| to_millis(std::time::SystemTime::now()));
    let lineages = 2;
    let covered: Arc<[AtomicU64; 11]> = Arc::new([const { AtomicU64::new(0) }; 11]);
    let start = Instant::now();
    thread::scope(|s| {
        for l in 0..lineages {
            let covered = Arc::clone(&covered);
            let per = cuts / lineages + usize::from(l < cuts % lineages);
            s.spawn(move || lineage(per, seed.wrapping_add(l as u64 * 0x9e37), &covered));
        }
    });
    let n = |i: usize| covered[i].load(Ordering::Relaxed);
    eprintln!(
        "power-loss model: {cuts} cuts in {:.1} s (seed {seed}): {} unsynced log writes at the cuts, {} cuts with 2 or more; acknowledged: {} acquisitions ({} of them takeovers of a stale lease), {} completions, {} releases, {} extends, {} expires; {} keys pending at a cut taken over by the first reserve after it; {} cuts during a checkpoint's durable commit; {} cuts after whole expiry windows were deleted",
        start.elapsed().as_secs_f64(),
        n(0),
        n(1),
        n(2),
        n(3),
        n(4),
        n(5),
        n(6),
        n(7),
        n(8),
        n(9),
        n(10),
    );
    assert!(
        cuts < 100 || n(10) > 0,
        "no cut came after an expiry window was deleted in {cuts} cuts"
    );
    assert!(
        cuts < 100 || n(9) > 0,
        "no cut came during a checkpoint's durable commit in {cuts} cuts"
    );
    // Over the run, not per cut: whether a held sync leaves 2 frames unsynced before the
    // cut depends on how the threads were scheduled in that cut's few milliseconds (about one
    // cut in eleven gets there).
    assert!(
        cuts < 100 || n(1) > 0,
        "no cut came with 2 or more log frames in flight in {cuts} cuts"
    );
    assert!(
        cuts < 100 || n(8) > 0,
        "no key was pending at any of {cuts} cuts: the takeover after a restart went unchecked"
    );
}
