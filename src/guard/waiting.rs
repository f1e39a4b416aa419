//! The requests this guard is running, so a duplicate can wait for the first one's answer
//! ([`Guard::wait_for_first`](crate::guard::Guard::wait_for_first)) instead of polling the
//! store: the running request wakes its waiters once its key is completed or released.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::Key;

/// Keys acquired by running requests of one guard (and its clones), each with the
/// notification its waiters wait on.
#[derive(Debug, Default)]
pub(crate) struct Runs {
    map: Mutex<HashMap<Key, Arc<Notify>>>,
}

impl Runs {
    /// Registers a request that acquired `key`; [`Watch::finish`] wakes its waiters.
    pub(crate) fn start(self: &Arc<Self>, key: &Key) -> Watch {
        let notify = Arc::new(Notify::new());
        self.map.lock().insert(key.clone(), Arc::clone(&notify));
        Watch {
            runs: Arc::clone(self),
            key: key.clone(),
            notify,
        }
    }

    /// The notification of the request of this guard running `key`, if there is one.
    pub(crate) fn running(&self, key: &Key) -> Option<Arc<Notify>> {
        self.map.lock().get(key).cloned()
    }
}

/// A running request's registration.
#[derive(Debug)]
pub(crate) struct Watch {
    runs: Arc<Runs>,
    key: Key,
    notify: Arc<Notify>,
}

impl Watch {
    /// The request is done and its key completed or released (the store's answer has
    /// changed): unregisters it and wakes every waiter.
    pub(crate) fn finish(self) {
        {
            let mut map = self.runs.map.lock();
            if map
                .get(&self.key)
                .is_some_and(|notify| Arc::ptr_eq(notify, &self.notify))
            {
                map.remove(&self.key);
            }
        }
        self.notify.notify_waiters();
    }
}
