//! Waiting for a key to change: threads parked in
//! [`Store::reserve_or_wait`](crate::Store::reserve_or_wait), and tasks awaiting
//! [`Reservations::reserve_or_wait`](crate::Reservations::reserve_or_wait), are woken when a
//! commit changes their key, so waiting needs no polling loop. A task's deadline is kept by
//! one timer thread shared by every store of the process ([`wake_at`]), so the async wait
//! works on any executor.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::thread::{self, Thread};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::key::Key;

/// A task's wake-up: fired by a commit that changes its key or by its deadline.
#[derive(Debug, Default)]
pub(crate) struct Signal {
    fired: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Signal {
    /// Fires the signal and wakes the task awaiting it.
    pub(crate) fn fire(&self) {
        self.fired.store(true, Ordering::SeqCst);
        if let Some(waker) = self.waker.lock().take() {
            waker.wake();
        }
    }

    /// A future that is ready once the signal fired.
    pub(crate) fn fired(self: &Arc<Self>) -> Fired {
        Fired(Arc::clone(self))
    }
}

/// The future of [`Signal::fired`].
pub(crate) struct Fired(Arc<Signal>);

impl Future for Fired {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.fired.load(Ordering::SeqCst) {
            return Poll::Ready(());
        }
        *self.0.waker.lock() = Some(cx.waker().clone());
        // Fired between the check and the registration: do not sleep through it.
        if self.0.fired.load(Ordering::SeqCst) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

/// Who waits for a key: a parked thread or a task.
#[derive(Debug)]
enum Waiter {
    Thread(Thread),
    Task(Arc<Signal>),
}

impl Waiter {
    fn wake(self) {
        match self {
            Waiter::Thread(thread) => thread.unpark(),
            Waiter::Task(signal) => signal.fire(),
        }
    }
}

/// Threads and tasks waiting for keys to change.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    map: Mutex<HashMap<Key, Vec<Waiter>>>,
    /// How many are registered, so commits skip the lock when none are.
    count: AtomicUsize,
}

impl Waiters {
    /// Registers the current thread to be unparked when `key` changes.
    pub(crate) fn register(&self, key: &Key) {
        self.add(key, Waiter::Thread(thread::current()));
    }

    /// Registers a task's signal, fired when `key` changes.
    pub(crate) fn register_task(&self, key: &Key, signal: &Arc<Signal>) {
        self.add(key, Waiter::Task(Arc::clone(signal)));
    }

    fn add(&self, key: &Key, waiter: Waiter) {
        let mut map = self.map.lock();
        map.entry(key.clone()).or_default().push(waiter);
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    /// Removes the current thread's registration for `key`, if still there.
    pub(crate) fn unregister(&self, key: &Key) {
        let me = thread::current().id();
        self.remove(key, |w| matches!(w, Waiter::Thread(t) if t.id() == me));
    }

    /// Removes a task's registration for `key`, if still there.
    pub(crate) fn unregister_task(&self, key: &Key, signal: &Arc<Signal>) {
        self.remove(
            key,
            |w| matches!(w, Waiter::Task(s) if Arc::ptr_eq(s, signal)),
        );
    }

    fn remove(&self, key: &Key, mine: impl Fn(&Waiter) -> bool) {
        let mut map = self.map.lock();
        if let Some(waiters) = map.get_mut(key) {
            let before = waiters.len();
            waiters.retain(|w| !mine(w));
            self.count
                .fetch_sub(before - waiters.len(), Ordering::SeqCst);
            if waiters.is_empty() {
                map.remove(key);
            }
        }
    }

    /// Whether anyone is waiting.
    pub(crate) fn any(&self) -> bool {
        self.count.load(Ordering::SeqCst) > 0
    }

    /// Wakes every thread and task waiting for one of `keys`.
    pub(crate) fn notify<'a>(&self, keys: impl IntoIterator<Item = &'a Key>) {
        if self.count.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut map = self.map.lock();
        for key in keys {
            if let Some(waiters) = map.remove(key) {
                self.count.fetch_sub(waiters.len(), Ordering::SeqCst);
                for waiter in waiters {
                    waiter.wake();
                }
            }
        }
    }
}

/// Deadlines of waiting tasks, earliest first, and the condition the timer thread sleeps on.
struct Timer {
    due: Mutex<BinaryHeap<Reverse<Due>>>,
    changed: Condvar,
}

struct Due(Instant, Arc<Signal>);

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

/// Fires `signal` at `at`, from the process's one timer thread (started on first use).
pub(crate) fn wake_at(at: Instant, signal: &Arc<Signal>) {
    static TIMER: OnceLock<Arc<Timer>> = OnceLock::new();
    let timer = TIMER.get_or_init(|| {
        let timer = Arc::new(Timer {
            due: Mutex::new(BinaryHeap::new()),
            changed: Condvar::new(),
        });
        let worker = Arc::clone(&timer);
        thread::Builder::new()
            .name("idemstore-wait-timer".into())
            .spawn(move || run_timer(&worker))
            .expect("spawn the wait timer thread");
        timer
    });
    timer.due.lock().push(Reverse(Due(at, Arc::clone(signal))));
    timer.changed.notify_one();
}

fn run_timer(timer: &Timer) {
    let mut due = timer.due.lock();
    loop {
        let now = Instant::now();
        while due.peek().is_some_and(|Reverse(d)| d.0 <= now) {
            if let Some(Reverse(Due(_, signal))) = due.pop() {
                signal.fire();
            }
        }
        match due.peek() {
            Some(Reverse(next)) => {
                let at = next.0;
                timer.changed.wait_until(&mut due, at);
            }
            None => timer.changed.wait(&mut due),
        }
    }
}
