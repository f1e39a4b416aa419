//! Waiting for a key to change: threads parked in
//! [`Store::reserve_or_wait`](crate::Store::reserve_or_wait) are woken when a commit changes
//! their key, so waiting needs no polling loop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::{self, Thread};

use parking_lot::Mutex;

use crate::key::Key;

/// Threads waiting for keys to change.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    map: Mutex<HashMap<Key, Vec<Thread>>>,
    /// How many threads are registered, so commits skip the lock when none are.
    count: AtomicUsize,
}

impl Waiters {
    /// Registers the current thread to be unparked when `key` changes.
    pub(crate) fn register(&self, key: &Key) {
        let mut map = self.map.lock();
        map.entry(key.clone()).or_default().push(thread::current());
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    /// Removes the current thread's registration for `key`, if still there.
    pub(crate) fn unregister(&self, key: &Key) {
        let mut map = self.map.lock();
        let me = thread::current().id();
        if let Some(threads) = map.get_mut(key) {
            let before = threads.len();
            threads.retain(|t| t.id() != me);
            self.count
                .fetch_sub(before - threads.len(), Ordering::SeqCst);
            if threads.is_empty() {
                map.remove(key);
            }
        }
    }

    /// Whether any thread is waiting.
    pub(crate) fn any(&self) -> bool {
        self.count.load(Ordering::SeqCst) > 0
    }

    /// Wakes every thread waiting for one of `keys`.
    pub(crate) fn notify<'a>(&self, keys: impl IntoIterator<Item = &'a Key>) {
        if self.count.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut map = self.map.lock();
        for key in keys {
            if let Some(threads) = map.remove(key) {
                self.count.fetch_sub(threads.len(), Ordering::SeqCst);
                for thread in threads {
                    thread.unpark();
                }
            }
        }
    }
}
