//! Concurrent histories checked for linearizability against the one reference model
//! (`support/model.rs`): exactly once across time, with the engine's background work running
//! between and during the operations.
//!
//! A history runs on one store (simulated disks, background work manual:
//! `Builder::__manual_background`) in segments. In each segment [`THREADS`] threads run their
//! lists of operations on a few keys at once (reserve with one of two request bodies, so
//! `Mismatch` happens; complete, release_if_pending and extend with a lease picked from every
//! lease acquired so far by any thread, so stale owners try their luck; get; expire and
//! expire_forced), while one more thread runs background steps (`Store::__background`: the
//! applier's apply and commit, the writer forgetting what that commit holds, the overlay moving
//! to the record cache, a checkpoint started or finished, ended windows deleted, a flush).
//! Every invocation and every return is recorded, in the order they happen, under one lock.
//!
//! The clock stands still within a segment (a lease or a retention running out in the middle
//! of a call would make the model's answer depend on when the store read the clock) and moves
//! between segments, with every thread quiescent, by steps around the lease and the
//! retention, so leases run out and keys expire across segments.
//!
//! Each segment's history is checked with stateright's `LinearizabilityTester` against
//! [`Spec`], the reference model as a sequential specification: some order of the calls that
//! respects real time (a call that returned before another was invoked comes first) must give
//! every answer the model gives. The store chooses tokens in the order it linearizes, so the
//! spec does not predict them: an acquisition's token must be above every earlier one, and
//! is recorded. Deleting the ended windows is a step of the spec too (a record past its
//! expiry that is still stored answers `expire` as `Expired`, a deleted one as nothing); the
//! other background steps change nothing the model sees, so they stand in the printed
//! history only. The next segment starts from the model's state after the order found: the
//! answers fix that state (a lease completes its key with one result however often it calls,
//! so two concurrent completions by one lease leave the same record in either order).
//!
//! The threads' operation lists and the background steps come from a seed; the scheduling is
//! real concurrency, so a seed gives other interleavings on every run. A history that no order
//! explains fails the test, printing its seed and every event of its segments so far; so do
//! a panic and a call not answered within two minutes (a hang: the segment's calls take
//! milliseconds; the stuck threads are left behind so the failure is reported).
//!
//! Counts: `cargo test` runs 300 histories ([`HISTORIES`]) of 8 segments, each thread 5
//! operations and the background thread 4 steps a segment: 120 operations and 32 background
//! steps a history, about 45,000 calls in all (lease calls without a lease are skipped), a few
//! seconds in a debug build. `IDEMSTORE_LONG=1` runs 10,000 histories ([`LONG_HISTORIES`]).
//! `IDEMSTORE_LINEAR_HISTORIES=<n>` runs any number, and `IDEMSTORE_LINEAR_SEED=<s>` gives
//! every history seed `s` (the same lists, new schedules). The summary line (`--nocapture`)
//! counts the calls, those concurrent with another, acquisitions, replays and lost leases.

use std::fmt;
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idemstore::whitebox::{to_millis, Background, Millis};
use idemstore::{
    Error, Key, Lease, LeaseLostReason, ManualClock, Record, RecordClass, Reservation, Status,
    Store,
};
use parking_lot::Mutex;
use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};

use crate::support::model::{body, Answer, Keys, Model};
use crate::support::sim::{Rng, SimDisk};

const LEASE_MS: Millis = 1_000;
const RETENTION_MS: Millis = 5_000;
const START_MS: Millis = 1_700_000_000_000;
/// Keys 0 and 2 differ only in their scope.
const KEYS: usize = 3;
const THREADS: usize = 3;
/// Operations per thread per segment.
const OPS: usize = 5;
/// Background steps per segment.
const STEPS: usize = 4;
const SEGMENTS: usize = 8;
const HISTORIES: usize = 300;
const LONG_HISTORIES: usize = 10_000;

fn key_of(index: usize) -> Key {
    let scope = if index == 2 { "tenant-b" } else { "tenant-a" };
    Key::new(scope, "POST /charges", format!("k{}", index % 2)).expect("valid key")
}

fn at(ms: Millis) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// The result a lease completes its key with: the same for every call with that lease, so
/// two concurrent completions by one lease leave the same record whichever goes first.
fn result_of(key: usize, token: u64) -> Vec<u8> {
    format!("key {key} token {token}").into_bytes()
}

/// One operation of a thread's list, as the seed gives it. A lease operation picks one of
/// the leases acquired so far (by any thread; current or long taken over) and is skipped
/// while there is none.
#[derive(Debug, Clone, Copy)]
enum Step {
    Reserve { key: usize, body: u8 },
    Complete { lease: usize },
    Release { lease: usize },
    Extend { lease: usize },
    Get { key: usize },
    Expire { key: usize, force: bool },
}

/// A call as the history records it: the lease operations name the key and the token.
#[derive(Debug, Clone, PartialEq)]
enum Call {
    Reserve { key: usize, body: u8 },
    Complete { key: usize, token: u64 },
    Release { key: usize, token: u64 },
    Extend { key: usize, token: u64 },
    Get { key: usize },
    Expire { key: usize, force: bool },
    Background(Background),
}

/// What a call returned, in plain fields (times in milliseconds). `Failed` is an error no
/// operation may give here; no order explains it.
#[derive(Debug, Clone, PartialEq)]
enum Ret {
    /// The answer, and an acquired lease's token and end.
    Reserved(Answer, Option<(u64, Millis)>),
    Completed(Result<(), LeaseLostReason>),
    Released(Result<bool, LeaseLostReason>),
    /// The extended lease's end.
    Extended(Result<Millis, LeaseLostReason>),
    Got(Option<View>),
    /// The removed record's class, or the end of the live lease that refused it.
    Expired(Result<Option<RecordClass>, Millis>),
    Stepped,
    Failed(String),
}

/// A stored record as `get` shows it.
#[derive(Debug, Clone, PartialEq)]
struct View {
    token: u64,
    attempt: u32,
    body: u8,
    expires_at: Option<Millis>,
    /// `Some` with the lease's end while pending, `None` once completed.
    lease_until: Option<Millis>,
    /// The result and when it was completed.
    completed: Option<(Vec<u8>, Millis)>,
}

impl View {
    fn of_record(record: &Record) -> Result<View, String> {
        let body = (0..2)
            .find(|b| body(*b) == record.fingerprint())
            .ok_or_else(|| format!("a fingerprint no call sent: {record:?}"))?;
        let (lease_until, completed) = match record.status() {
            Status::Pending {
                lease_until,
                progress: None,
            } => (Some(to_millis(lease_until)), None),
            Status::Completed {
                result,
                completed_at,
            } => (None, Some((result.to_vec(), to_millis(completed_at)))),
            _ => return Err(format!("a state no call makes: {record:?}")),
        };
        Ok(View {
            token: record.token(),
            attempt: record.attempt(),
            body,
            expires_at: record.expires_at().map(to_millis),
            lease_until,
            completed,
        })
    }

    fn of_model(model: &Model, expires_at: Option<Millis>) -> View {
        let (lease_until, completed) = match model {
            Model::Pending { lease_until, .. } => (Some(*lease_until), None),
            Model::Completed {
                result,
                completed_at,
                ..
            } => (None, Some((result.clone(), *completed_at))),
            other => unreachable!("no call makes {other:?}"),
        };
        View {
            token: model.token().expect("a stored record"),
            attempt: model.attempt().expect("a stored record"),
            body: model.body().expect("a stored record"),
            expires_at,
            lease_until,
            completed,
        }
    }
}

/// The reference model as a sequential specification: the model of the whole store, which
/// each call steps.
#[derive(Clone)]
struct Spec(Keys);

impl fmt::Debug for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut records: Vec<_> = self.0.records.iter().collect();
        records.sort_by_key(|(k, _)| **k);
        f.debug_struct("Spec")
            .field("now", &self.0.now)
            .field("max_token", &self.0.max_token)
            .field("records", &records)
            .finish()
    }
}

impl Spec {
    fn new() -> Spec {
        Spec(Keys::new(START_MS, LEASE_MS, |_| RETENTION_MS))
    }

    /// Steps the model by `call`; an acquisition gets `token`.
    fn run(&mut self, call: &Call, next_token: u64) -> Ret {
        let m = &mut self.0;
        match *call {
            Call::Reserve { key, body } => {
                let answer = m.reserve(key, body);
                let lease = match answer {
                    Answer::Acquired { attempt } => {
                        m.max_token = next_token;
                        m.pending(key, body, next_token, attempt);
                        Some((next_token, m.now + m.lease))
                    }
                    _ => None,
                };
                Ret::Reserved(answer, lease)
            }
            Call::Complete { key, token } => {
                let already = matches!(
                    m.live(key),
                    Some(Model::Completed { token: t, .. }) if *t == token
                );
                // The same lease completing again: accepted, the first result stays.
                if !already {
                    if let Err(reason) = m.owner_check(key, token) {
                        return Ret::Completed(Err(reason));
                    }
                    m.complete(key, result_of(key, token), None);
                }
                Ret::Completed(Ok(()))
            }
            Call::Release { key, token } => Ret::Released(match m.live(key) {
                // Never deletes a completed key; nothing to release when absent.
                None | Some(Model::Completed { .. }) => Ok(false),
                Some(_) => m.owner_check(key, token).map(|()| {
                    m.records.remove(&key);
                    true
                }),
            }),
            Call::Extend { key, token } => Ret::Extended(m.owner_check(key, token).map(|()| {
                m.extend(key);
                m.now + m.lease
            })),
            Call::Get { key } => {
                Ret::Got(m.live(key).map(|r| View::of_model(r, m.expires_at(key))))
            }
            Call::Expire { key, force } => Ret::Expired(m.expire(key, force)),
            Call::Background(Background::DropEndedWindows) => {
                m.drop_ended_windows();
                Ret::Stepped
            }
            Call::Background(_) => Ret::Stepped,
        }
    }
}

impl SequentialSpec for Spec {
    type Op = Call;
    type Ret = Ret;

    /// What the model answers, an acquisition getting the next token (only for a call still
    /// in flight; every call of a segment returns).
    fn invoke(&mut self, call: &Call) -> Ret {
        let next = self.0.max_token + 1;
        self.run(call, next)
    }

    /// The store picks the tokens: an acquired lease's token must be above every earlier one
    /// and is taken as it is; the rest of the answer must be the model's.
    fn is_valid_step(&mut self, call: &Call, ret: &Ret) -> bool {
        let next = match ret {
            Ret::Reserved(_, Some((token, _))) if *token <= self.0.max_token => return false,
            Ret::Reserved(_, Some((token, _))) => *token,
            _ => self.0.max_token + 1,
        };
        self.run(call, next) == *ret
    }
}

/// One segment of a history: each thread's operations, the background steps, and how far the
/// clock moves once they have all returned.
#[derive(Debug)]
struct Segment {
    threads: Vec<Vec<Step>>,
    background: Vec<Background>,
    advance_ms: Millis,
}

fn plan(seed: u64) -> Vec<Segment> {
    let mut rng = Rng(seed.wrapping_mul(2).wrapping_add(1));
    let mut pick = |n: u64| rng.next() % n;
    (0..SEGMENTS)
        .map(|_| Segment {
            threads: (0..THREADS)
                .map(|_| (0..OPS).map(|_| step(&mut pick)).collect())
                .collect(),
            background: (0..STEPS).map(|_| background(&mut pick)).collect(),
            advance_ms: match pick(8) {
                0 => 0,
                1 => 1,
                2 => LEASE_MS - 1,
                3 => LEASE_MS,
                4 => RETENTION_MS,
                5 => LEASE_MS + RETENTION_MS,
                _ => pick(2 * RETENTION_MS),
            },
        })
        .collect()
}

fn step(pick: &mut impl FnMut(u64) -> u64) -> Step {
    let key = pick(KEYS as u64) as usize;
    let lease = pick(u64::from(u16::MAX)) as usize;
    match pick(14) {
        0..=3 => Step::Reserve {
            key,
            body: u8::from(pick(4) == 0),
        },
        4..=6 => Step::Complete { lease },
        7 => Step::Release { lease },
        8 => Step::Extend { lease },
        9..=11 => Step::Get { key },
        _ => Step::Expire {
            key,
            force: pick(2) == 0,
        },
    }
}

fn background(pick: &mut impl FnMut(u64) -> u64) -> Background {
    use Background::*;
    match pick(11) {
        0 => Apply,
        1..=3 => ApplierCommit,
        4 => WriterDrain,
        5 => DrainOverlay,
        6 => CheckpointStart,
        7 => CheckpointFinish,
        8 | 9 => DropEndedWindows,
        _ => Flush,
    }
}

/// An invocation or a return of one thread (the background thread is [`THREADS`]).
#[derive(Debug, Clone)]
enum Event {
    Invoke(usize, Call),
    Return(usize, Ret),
}

/// What the threads share: the events in the order they happened and every lease acquired.
#[derive(Default)]
struct Shared {
    events: Vec<Event>,
    leases: Vec<(usize, Lease)>,
}

/// The call a step makes now, with the lease it uses; `None` while there is no lease.
fn resolve(step: Step, leases: &[(usize, Lease)]) -> Option<(Call, Option<Lease>)> {
    // Half the picks go to the three newest leases (most likely still their key's owner),
    // the other half to any lease acquired so far.
    let lease = |i: usize| {
        let n = leases.len();
        if n == 0 {
            return None;
        }
        let index = match i % 2 {
            0 => n - 1 - i / 2 % n.min(3),
            _ => i / 2 % n,
        };
        let (key, lease) = &leases[index];
        Some((*key, lease.token(), lease.clone()))
    };
    Some(match step {
        Step::Reserve { key, body } => (Call::Reserve { key, body }, None),
        Step::Get { key } => (Call::Get { key }, None),
        Step::Expire { key, force } => (Call::Expire { key, force }, None),
        Step::Complete { lease: i } => {
            let (key, token, lease) = lease(i)?;
            (Call::Complete { key, token }, Some(lease))
        }
        Step::Release { lease: i } => {
            let (key, token, lease) = lease(i)?;
            (Call::Release { key, token }, Some(lease))
        }
        Step::Extend { lease: i } => {
            let (key, token, lease) = lease(i)?;
            (Call::Extend { key, token }, Some(lease))
        }
    })
}

/// Runs `call` on the store; an acquired lease comes back beside the answer.
fn perform(store: &Store, call: &Call, lease: Option<&Lease>) -> (Ret, Option<Lease>) {
    let lease = || lease.expect("a lease call carries its lease");
    let ret = match *call {
        Call::Reserve { key, body: b } => match store.reserve(&key_of(key), body(b)) {
            Ok(reservation) => return reserved(reservation, key),
            Err(e) => Ret::Failed(e.to_string()),
        },
        Call::Complete { key, token } => {
            let done = store.complete(lease(), result_of(key, token));
            lease_ret(done, lease(), Ret::Completed)
        }
        Call::Release { .. } => {
            lease_ret(store.release_if_pending(lease()), lease(), Ret::Released)
        }
        Call::Extend { .. } => match store.extend(lease()) {
            Ok(new)
                if new.token() == lease().token()
                    && new.attempt() == lease().attempt()
                    && new.key() == lease().key() =>
            {
                Ret::Extended(Ok(to_millis(new.lease_until())))
            }
            Ok(new) => Ret::Failed(format!("extended into another lease: {new:?}")),
            Err(e) => lease_ret(Err(e), lease(), Ret::Extended),
        },
        Call::Get { key } => match store.get(&key_of(key)) {
            Ok(None) => Ret::Got(None),
            Ok(Some(record)) => {
                View::of_record(&record).map_or_else(Ret::Failed, |v| Ret::Got(Some(v)))
            }
            Err(e) => Ret::Failed(e.to_string()),
        },
        Call::Expire { key, force } => {
            let k = key_of(key);
            let expired = if force {
                store.expire_forced(&k)
            } else {
                store.expire(&k)
            };
            match expired {
                Ok(class) => Ret::Expired(Ok(class)),
                Err(Error::LeaseLive {
                    key: named,
                    lease_until,
                }) if named == k => Ret::Expired(Err(to_millis(lease_until))),
                Err(e) => Ret::Failed(e.to_string()),
            }
        }
        Call::Background(step) => match store.__background(step) {
            Ok(()) => Ret::Stepped,
            Err(e) => Ret::Failed(e.to_string()),
        },
    };
    (ret, None)
}

/// A lease call's answer: its value or the reason it lost the lease (an error naming this
/// lease's key and token); any other error is a failure.
fn lease_ret<T>(
    result: Result<T, Error>,
    lease: &Lease,
    ret: impl FnOnce(Result<T, LeaseLostReason>) -> Ret,
) -> Ret {
    match result {
        Ok(value) => ret(Ok(value)),
        Err(Error::LeaseLost { key, token, reason })
            if &key == lease.key() && token == lease.token() =>
        {
            ret(Err(reason))
        }
        Err(e) => Ret::Failed(e.to_string()),
    }
}

fn reserved(reservation: Reservation, key: usize) -> (Ret, Option<Lease>) {
    let answer = match reservation {
        Reservation::Acquired(lease) => {
            if lease.key() != &key_of(key) {
                return (
                    Ret::Failed(format!("a lease for another key: {lease:?}")),
                    None,
                );
            }
            let fields = (lease.token(), to_millis(lease.lease_until()));
            let answer = Answer::Acquired {
                attempt: lease.attempt(),
            };
            return (Ret::Reserved(answer, Some(fields)), Some(lease));
        }
        Reservation::Completed(done) => Answer::Completed {
            result: done.result,
            completed_at: to_millis(done.completed_at),
            expires_at: to_millis(done.expires_at),
            attempt: done.attempt,
        },
        Reservation::InProgress {
            retry_after,
            attempt,
        } => Answer::InProgress {
            retry_after_ms: u64::try_from(retry_after.as_millis()).expect("a short wait"),
            attempt,
        },
        Reservation::Mismatch => Answer::Mismatch,
        other => {
            return (
                Ret::Failed(format!("an answer no call asks for: {other:?}")),
                None,
            )
        }
    };
    (Ret::Reserved(answer, None), None)
}

/// How long a segment may take before the test calls it a hang: its calls take
/// milliseconds, so only a call that is never answered reaches this.
const HANG: Duration = Duration::from_secs(120);

/// Runs one segment: the threads and the background thread start together; every event is
/// recorded under the shared lock, an invocation before the call and a return after it.
/// `Err` when a thread panicked, or when a call was not answered within [`HANG`] (its thread
/// is left behind, so that the test fails with the history rather than hanging).
fn run_segment(
    store: &Arc<Store>,
    shared: &Arc<Mutex<Shared>>,
    segment: &Segment,
) -> Result<(), String> {
    let start = Arc::new(Barrier::new(THREADS + 1));
    let (done, finished) = mpsc::channel();
    let spawn = |f: Box<dyn FnOnce() + Send>| {
        let (start, done) = (Arc::clone(&start), done.clone());
        thread::spawn(move || {
            // Reports on the way out, also when unwinding.
            struct Report(mpsc::Sender<bool>);
            impl Drop for Report {
                fn drop(&mut self) {
                    let _ = self.0.send(thread::panicking());
                }
            }
            let _report = Report(done);
            start.wait();
            f();
        });
    };
    for (thread, steps) in segment.threads.iter().enumerate() {
        let (store, shared, steps) = (Arc::clone(store), Arc::clone(shared), steps.clone());
        spawn(Box::new(move || {
            for step in steps {
                let (call, lease) = {
                    let mut shared = shared.lock();
                    let Some((call, lease)) = resolve(step, &shared.leases) else {
                        continue;
                    };
                    shared.events.push(Event::Invoke(thread, call.clone()));
                    (call, lease)
                };
                let (ret, acquired) = perform(&store, &call, lease.as_ref());
                let mut shared = shared.lock();
                shared.events.push(Event::Return(thread, ret));
                if let (Some(lease), Call::Reserve { key, .. }) = (acquired, &call) {
                    shared.leases.push((*key, lease));
                }
            }
        }));
    }
    let (store, shared, steps) = (
        Arc::clone(store),
        Arc::clone(shared),
        segment.background.clone(),
    );
    spawn(Box::new(move || {
        for step in steps {
            let call = Call::Background(step);
            shared
                .lock()
                .events
                .push(Event::Invoke(THREADS, call.clone()));
            let (ret, _) = perform(&store, &call, None);
            shared.lock().events.push(Event::Return(THREADS, ret));
        }
    }));
    let deadline = Instant::now() + HANG;
    for _ in 0..=THREADS {
        let wait = deadline.saturating_duration_since(Instant::now());
        match finished.recv_timeout(wait) {
            Ok(false) => {}
            Ok(true) => return Err("panicked (the panic is printed above)".into()),
            Err(_) => {
                return Err(format!(
                    "hung: a call was not answered within {HANG:?} (the calls invoked \
                     without a return below)"
                ))
            }
        }
    }
    Ok(())
}

/// Checks one segment's events against the spec from `start`; returns the spec after the
/// order found, or `None` when no order explains them.
fn check_segment(start: &Spec, events: &[Event]) -> Option<Spec> {
    // A background step other than deleting the ended windows changes nothing the model
    // sees: it stays out of the search.
    let modelled = |call: &Call| !matches!(call, Call::Background(step) if *step != Background::DropEndedWindows);
    let mut tester = LinearizabilityTester::new(start.clone());
    let mut skipped = [false; THREADS + 1];
    for event in events {
        match event {
            Event::Invoke(t, call) => {
                skipped[*t] = !modelled(call);
                if !skipped[*t] {
                    tester
                        .on_invoke(*t, call.clone())
                        .expect("a well-formed history");
                }
            }
            Event::Return(t, ret) => {
                if !skipped[*t] {
                    tester
                        .on_return(*t, ret.clone())
                        .expect("a well-formed history");
                }
            }
        }
    }
    let order = tester.serialized_history()?;
    let mut end = start.clone();
    for (call, ret) in &order {
        assert!(end.is_valid_step(call, ret), "the order found replays");
    }
    Some(end)
}

/// Runs the history of `seed` on a fresh store; on a history no order explains, panics with
/// the seed and every event.
fn run_history(seed: u64, tally: &mut Tally) {
    let clock = ManualClock::starting_at(at(START_MS));
    let store = Store::builder()
        .lease(Duration::from_millis(LEASE_MS))
        .retention(Duration::from_millis(RETENTION_MS))
        .clock(clock.clone())
        .sweep_interval(None)
        .checkpoint_bytes(64 * 1024)
        .cache_records(2)
        .__manual_background()
        .open_with_storage(SimDisk::new(), SimDisk::new())
        .expect("open the store");
    let store = Arc::new(store);
    let shared = Arc::new(Mutex::new(Shared::default()));
    let mut spec = Spec::new();
    let mut transcript = String::new();
    for (i, segment) in plan(seed).iter().enumerate() {
        let from = shared.lock().events.len();
        let ran = run_segment(&store, &shared, segment);
        let events = shared.lock().events[from..].to_vec();
        tally.add(&events);
        transcript += &format!(
            "segment {i} at {} ms, from {spec:?}\n",
            spec.0.now - START_MS
        );
        for event in &events {
            transcript += &match event {
                Event::Invoke(t, call) => format!("  {t} invokes {call:?}\n"),
                Event::Return(t, ret) => format!("  {t} returns {ret:?}\n"),
            };
        }
        let fail = |what: &str| -> ! {
            panic!(
                "seed {seed}: segment {i} {what} (threads 0-{}: operations, thread {THREADS}: \
                 background steps; replay with IDEMSTORE_LINEAR_SEED={seed}):\n{transcript}",
                THREADS - 1
            )
        };
        if let Err(what) = ran {
            fail(&what);
        }
        let Some(end) = check_segment(&spec, &events) else {
            fail("is not linearizable against the reference model");
        };
        spec = end;
        clock.advance(Duration::from_millis(segment.advance_ms));
        spec.0.now += segment.advance_ms;
    }
}

/// What the histories held: calls, calls that overlapped another (invoked while another
/// thread's call was in flight), and acquisitions, replays and lost leases.
#[derive(Default)]
struct Tally {
    calls: usize,
    overlapped: usize,
    acquired: usize,
    replayed: usize,
    lost: usize,
}

impl Tally {
    fn add(&mut self, events: &[Event]) {
        let mut in_flight = [false; THREADS + 1];
        let mut overlapped = [false; THREADS + 1];
        for event in events {
            match event {
                Event::Invoke(t, _) => {
                    self.calls += 1;
                    in_flight[*t] = true;
                    overlapped[*t] = false;
                    if in_flight.iter().filter(|f| **f).count() > 1 {
                        for (o, f) in overlapped.iter_mut().zip(in_flight) {
                            *o |= f;
                        }
                    }
                }
                Event::Return(t, ret) => {
                    in_flight[*t] = false;
                    self.overlapped += usize::from(overlapped[*t]);
                    match ret {
                        Ret::Reserved(Answer::Acquired { .. }, _) => self.acquired += 1,
                        Ret::Reserved(Answer::Completed { .. }, _) => self.replayed += 1,
                        Ret::Completed(Err(_)) | Ret::Released(Err(_)) | Ret::Extended(Err(_)) => {
                            self.lost += 1
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

fn histories() -> usize {
    if let Some(n) = std::env::var("IDEMSTORE_LINEAR_HISTORIES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    if std::env::var_os("IDEMSTORE_LONG").is_some_and(|v| v != "0") {
        LONG_HISTORIES
    } else {
        HISTORIES
    }
}

#[test]
fn concurrent_histories_with_background_work_are_linearizable() {
    let fixed: Option<u64> = std::env::var("IDEMSTORE_LINEAR_SEED")
        .ok()
        .and_then(|v| v.parse().ok());
    let started = std::time::Instant::now();
    let count = histories();
    let mut tally = Tally::default();
    for i in 0..count {
        run_history(fixed.unwrap_or(i as u64), &mut tally);
    }
    let Tally {
        calls,
        overlapped,
        acquired,
        replayed,
        lost,
    } = tally;
    println!(
        "{count} histories, {calls} calls (operations and background steps), {overlapped} of \
         them concurrent with another; {acquired} acquired, {replayed} replayed, {lost} leases \
         lost; {:.1?}",
        started.elapsed()
    );
}

/// The spec refuses what the store must never do: a token not above every earlier one, and
/// a completed key answering a release.
#[test]
fn the_spec_refuses_a_reused_token_and_a_released_completed_key() {
    let mut spec = Spec::new();
    let acquire = Call::Reserve { key: 0, body: 0 };
    let acquired = |token| {
        Ret::Reserved(
            Answer::Acquired { attempt: 1 },
            Some((token, START_MS + LEASE_MS)),
        )
    };
    assert!(spec.is_valid_step(&acquire, &acquired(7)));
    assert!(!spec
        .clone()
        .is_valid_step(&Call::Reserve { key: 1, body: 0 }, &acquired(7)));
    let complete = Call::Complete { key: 0, token: 7 };
    assert!(spec.is_valid_step(&complete, &Ret::Completed(Ok(()))));
    let release = Call::Release { key: 0, token: 7 };
    assert!(!spec
        .clone()
        .is_valid_step(&release, &Ret::Released(Ok(true))));
    assert!(spec.is_valid_step(&release, &Ret::Released(Ok(false))));
}
