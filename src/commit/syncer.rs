//! The syncer: one fdatasync makes every frame written so far durable; then the batches it
//! covers are published to the overlay and their callers answered, in order.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, StorageError};
use crate::log::{LogFile, Wal};
use crate::state::Counter;

use super::request::Request;
use super::Written;
use crate::state::error_copy;
use crate::state::Engine;

/// A batch written to the log, waiting for a sync before its callers are answered.
pub(super) struct PendingBatch {
    pub(super) seq: u64,
    pub(super) requests: Vec<Arc<Request>>,
    /// The batch's changes, as the writer recorded them.
    pub(super) changes: Vec<Written>,
}

#[derive(Default)]
pub(super) struct SyncState {
    /// The last frame fully written to the log.
    pub(super) written_seq: u64,
    /// The last frame known durable.
    pub(super) synced_seq: u64,
    /// A thread is running a sync now.
    pub(super) syncing: bool,
    pub(super) pending: VecDeque<PendingBatch>,
}

/// Makes written frames durable and answers their batches. See the module docs.
pub(crate) struct Syncer {
    pub(super) file: Arc<dyn LogFile>,
    pub(super) path: PathBuf,
    pub(super) state: Mutex<SyncState>,
    /// Signalled whenever a sync ends (and `syncing` is cleared).
    pub(super) idle: Condvar,
    pub(super) engine: Arc<Engine>,
    /// The emptied vectors of answered batches, for the next batches to fill.
    spare: Mutex<Spare>,
}

/// Vectors of answered batches, emptied, kept for the next batches (a few of each).
#[derive(Default)]
struct Spare {
    requests: Vec<Vec<Arc<Request>>>,
    changes: Vec<Vec<Written>>,
}

/// How many emptied vectors of each kind are kept.
const SPARE: usize = 4;

impl Syncer {
    pub(super) fn new(wal: &Wal, engine: Arc<Engine>) -> Syncer {
        let last = wal.last_seq();
        Syncer {
            file: wal.file(),
            path: wal.path().to_path_buf(),
            state: Mutex::new(SyncState {
                written_seq: last,
                synced_seq: last,
                ..SyncState::default()
            }),
            idle: Condvar::new(),
            engine,
            spare: Mutex::new(Spare::default()),
        }
    }

    /// An empty vector for a batch's requests (one a batch answered before, when there is).
    pub(super) fn spare_requests(&self) -> Vec<Arc<Request>> {
        self.spare.lock().requests.pop().unwrap_or_default()
    }

    /// An empty vector for a batch's changes (one a batch answered before, when there is).
    pub(super) fn spare_changes(&self) -> Vec<Written> {
        self.spare.lock().changes.pop().unwrap_or_default()
    }

    /// Queues a batch whose frame `seq` was written, to be answered by the sync that covers
    /// it (driven by the batch's leader).
    pub(super) fn push(&self, batch: PendingBatch) {
        let mut state = self.state.lock();
        if batch.seq <= state.synced_seq {
            // It logged nothing and everything it saw is durable.
            self.publish(batch);
            return;
        }
        state.written_seq = state.written_seq.max(batch.seq);
        state.pending.push_back(batch);
    }

    /// Answers a batch without a sync (buffered durability).
    pub(super) fn publish_unsynced(&self, batch: PendingBatch) {
        let mut state = self.state.lock();
        state.written_seq = state.written_seq.max(batch.seq);
        self.publish(batch);
    }

    fn publish(&self, batch: PendingBatch) {
        let PendingBatch {
            seq,
            mut requests,
            mut changes,
        } = batch;
        let published = changes.drain(..).map(|w| (w.key, w.record));
        self.engine.overlay.publish(published, seq);
        for request in requests.drain(..) {
            request.publish();
        }
        let mut spare = self.spare.lock();
        if spare.requests.len() < SPARE {
            spare.requests.push(requests);
        }
        if spare.changes.len() < SPARE {
            spare.changes.push(changes);
        }
    }

    /// Runs syncs until every written frame is durable, or until `own` (the calling waiter's
    /// request) is answered and another waiting thread can take over.
    pub(crate) fn drive(&self, own: Option<&Request>) {
        let mut state = self.state.lock();
        if state.syncing {
            return;
        }
        state.syncing = true;
        drop(state);
        self.run_syncs(own);
        self.idle.notify_all();
    }

    /// The body of [`drive`](Syncer::drive), entered with `syncing` set; clears it on return.
    fn run_syncs(&self, own: Option<&Request>) {
        let mut state = self.state.lock();
        loop {
            if let Err(error) = self.engine.poison.check() {
                // Whatever failed, nothing still waiting will be synced: answer it now.
                for batch in state.pending.drain(..) {
                    for request in batch.requests {
                        request.fail(error_copy(&error));
                    }
                }
                state.syncing = false;
                return;
            }
            let target = state.written_seq;
            if state.synced_seq >= target {
                state.syncing = false;
                return;
            }
            drop(state);
            let result = self.file.sync_data();
            self.engine.counters.add(Counter::Syncs, 1);
            state = self.state.lock();
            match result {
                Ok(()) => {
                    state.synced_seq = state.synced_seq.max(target);
                    while state.pending.front().is_some_and(|b| b.seq <= target) {
                        let batch = state.pending.pop_front().expect("checked front");
                        self.publish(batch);
                    }
                }
                Err(e) => {
                    let error =
                        StorageError::io(format!("syncing log {}", self.path.display()), e).into();
                    self.engine.poison.set(&error);
                    self.engine.overlay.clear();
                    for batch in state.pending.drain(..) {
                        for request in batch.requests {
                            request.fail(self.engine.poison.answer(&error));
                        }
                    }
                    state.syncing = false;
                    return;
                }
            }
            let own_answered = own.is_some_and(|r| r.is_answered());
            if own_answered {
                let next = state
                    .pending
                    .front()
                    .and_then(|b| b.requests.iter().find(|r| r.waiter.is_thread()).cloned());
                if let Some(next) = next {
                    state.syncing = false;
                    drop(state);
                    next.waiter.wake();
                    return;
                }
            }
        }
    }

    /// Whether a sync is running or batches wait for one.
    pub(super) fn is_busy(&self) -> bool {
        let state = self.state.lock();
        state.syncing || !state.pending.is_empty()
    }

    /// The last frame known durable (recorded in every new frame; see `Wal::recover`).
    pub(super) fn synced_seq(&self) -> u64 {
        self.state.lock().synced_seq
    }

    /// Syncs until every written frame is durable and answered; fails if the store is poisoned.
    pub(super) fn drive_all(&self) -> Result<(), Error> {
        self.drive_until(None, &|| false)
    }

    /// Syncs until every frame written before the call is durable and answered (so a caller
    /// that keeps writing cannot keep the committer here); fails if the store is poisoned.
    ///
    /// While another thread leads the sync, this waits for it only as long as `queued` says
    /// no request waits to be written: once one does, it returns (`Ok`, the frames not yet
    /// durable) so that the committer writes the next batch while that sync runs, and drives
    /// again after it.
    /// `queued` runs with the sync state locked; a caller that queues a request after it
    /// answered `false` must call [`wake`](Syncer::wake) (the committer's queue tells it so).
    pub(super) fn drive_written(&self, queued: &dyn Fn() -> bool) -> Result<(), Error> {
        let written = self.state.lock().written_seq;
        self.drive_until(Some(written), queued)
    }

    /// Wakes a [`drive_written`](Syncer::drive_written) waiting for another thread's sync,
    /// to look at its queue again. (The lock is taken so that the wake-up cannot fall between
    /// the waiter's look and its wait: it holds the lock from one to the other.)
    pub(super) fn wake(&self) {
        drop(self.state.lock());
        self.idle.notify_all();
    }

    /// Syncs until frame `until` (every written frame when `None`) is durable and every batch
    /// up to it answered, or until `queued` says requests wait while another thread syncs.
    fn drive_until(&self, until: Option<u64>, queued: &dyn Fn() -> bool) -> Result<(), Error> {
        loop {
            self.drive(None);
            let mut state = self.state.lock();
            self.engine.poison.check()?;
            let done = match until {
                None => state.synced_seq >= state.written_seq && state.pending.is_empty(),
                Some(seq) => {
                    state.synced_seq >= seq && state.pending.front().is_none_or(|b| b.seq > seq)
                }
            };
            if done {
                return Ok(());
            }
            if state.syncing {
                // A waiting caller is syncing. Requests wait to be written: go and write them
                // (the batch after this sync is written while it runs, and synced after it).
                // Otherwise wait for the sync to end (or a request to come), then go again.
                if queued() {
                    return Ok(());
                }
                self.idle.wait_for(&mut state, Duration::from_millis(100));
            }
        }
    }
}
