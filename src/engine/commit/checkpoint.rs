//! Checkpoints, and the other transactions outside the batch path.
//!
//! A checkpoint is a durable redb commit: it makes every batch applied so far durable in the
//! B-tree file (whose meta table records the last applied log frame and where the frames after
//! it are). The committer checkpoints when the log grows past
//! [`Builder::checkpoint_bytes`](crate::Builder::checkpoint_bytes) and when the oldest
//! un-checkpointed frame is older than
//! [`Builder::checkpoint_interval`](crate::Builder::checkpoint_interval), in the background
//! ([`Writer::start_checkpoint`]): the writer commits the applier's transaction
//! (non-durably, as every 100 ms), moves new frames to the log's other region
//! ([`Wal::switch`](crate::engine::wal::Wal::switch)), and hands a durable commit of the meta
//! table to a checkpoint thread; it goes on deciding and logging batches meanwhile. The region
//! left is written again only once the commit is durable ([`Writer::finish_checkpoint`]).
//! [`Store::checkpoint`](crate::Store::checkpoint), `complete_with` and close commit durably
//! on the writer and rewind the log to its first region; sweeps commit unlogged.

use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use redb::WriteTransaction;

use super::{Writer, Written};
use crate::engine::stats::Counter;
use crate::error::Error;
use crate::format::identity::LOG_HEADER_LEN;
use crate::format::tables::{new_salt, Tables};
use crate::record::Millis;

/// What the applier and a background checkpoint's thread share: whether a checkpoint's
/// durable commit runs (the applier opens no transaction meanwhile: redb would make it wait
/// anyway, and it must see a failed commit's error as the store's poison, not the error redb
/// gives every transaction after it), and a closure the crate's tests run on the thread just
/// before the commit (to hold it, feature `__whitebox`).
#[derive(Default)]
pub(crate) struct CheckpointState {
    committing: Mutex<bool>,
    done: Condvar,
    hook: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl CheckpointState {
    /// Arms `hook` for the next background checkpoint.
    #[cfg(feature = "__whitebox")]
    pub(crate) fn arm(&self, hook: Box<dyn FnOnce() + Send>) {
        *self.hook.lock() = Some(hook);
    }

    /// Waits until no checkpoint's commit runs.
    pub(crate) fn wait_idle(&self) {
        let mut committing = self.committing.lock();
        while *committing {
            self.done.wait(&mut committing);
        }
    }

    fn begin(&self) {
        *self.committing.lock() = true;
    }

    fn end(&self) {
        *self.committing.lock() = false;
        self.done.notify_all();
    }

    fn run_hook(&self) {
        let hook = self.hook.lock().take();
        if let Some(hook) = hook {
            hook();
        }
    }
}

/// A background checkpoint: its thread, which returns the commit's outcome.
pub(crate) type Running = JoinHandle<Result<(), Error>>;

/// How a transaction outside the batch path is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CommitKind {
    /// A durable redb commit, which also checkpoints the log. Changes are not logged.
    Durable,
    /// Neither logged nor durable: only for changes that may be lost in a crash without
    /// changing any answer (sweeping expired records).
    Unlogged,
}

impl Writer {
    /// Bytes of log written since the last checkpoint: what the next checkpoint, or a reopen
    /// after a crash now, writes into the B-tree file.
    pub(crate) fn log_since_checkpoint(&self) -> u64 {
        self.wal.len_since_rewind()
    }

    /// Runs `f` in its own write transaction (after [`flush`](Writer::flush)), committed as
    /// `kind` says. `Ok(Ok(r))` commits; `Ok(Err(e))` rolls back and returns `e` (a refusal,
    /// such as a lost lease); an outer `Err` is a storage failure and poisons the store.
    pub(crate) fn transact<R>(
        &mut self,
        kind: CommitKind,
        f: impl FnOnce(
            &mut Writer,
            &WriteTransaction,
            Millis,
            &mut Vec<Written>,
        ) -> Result<Result<R, Error>, Error>,
    ) -> Result<R, Error> {
        self.flush()?;
        let token_before = self.next_token;
        let durability = match kind {
            CommitKind::Durable => redb::Durability::Immediate,
            CommitKind::Unlogged => redb::Durability::None,
        };
        let txn = match self.begin(durability) {
            Ok(txn) => txn,
            Err(error) => return Err(self.fail(error)),
        };
        let now = self.engine.now();
        let mut written = Vec::new();
        let value = match f(self, &txn, now, &mut written) {
            Ok(Ok(value)) => value,
            Ok(Err(refusal)) => {
                self.next_token = token_before;
                if let Err(e) = txn.abort() {
                    return Err(self.fail(Error::storage("rolling back a transaction", e)));
                }
                return Err(refusal);
            }
            Err(error) => return Err(self.fail(error)),
        };
        let new_salt = new_salt();
        if self.next_token != token_before || kind == CommitKind::Durable {
            let saved = Tables::open(&txn).and_then(|mut t| {
                t.set_next_token(self.next_token)?;
                if kind == CommitKind::Durable {
                    // Frames after this checkpoint use a new salt, so no frame from before it
                    // (nor bytes shaped like one) can pass as current after the rewind. The
                    // next region's salt is unused still (no background checkpoint runs).
                    t.set_log_region(LOG_HEADER_LEN, new_salt, self.wal.next_salt())?;
                }
                Ok(())
            });
            if let Err(error) = saved {
                return Err(self.fail(error));
            }
        }
        if let Err(e) = txn.commit() {
            return Err(self.fail(Error::storage("committing a write transaction", e)));
        }
        self.engine.counters.add(Counter::Commits, 1);
        if kind == CommitKind::Durable {
            self.engine.counters.add(Counter::Checkpoints, 1);
            #[cfg(feature = "tracing")]
            tracing::debug!(
                log_bytes = self.wal.len_since_rewind(),
                "idemstore checkpoint: durable redb commit, log rewound"
            );
            // Every frame so far is now in the durable redb file.
            self.wal.rewind(new_salt);
            self.engine.poison.set_replay(self.wal.unreplayed());
            self.last_checkpoint = Instant::now();
        }
        self.engine
            .overlay
            .waiters
            .notify(written.iter().map(|w| &w.key));
        for w in written {
            self.engine.cache.set(&w.key, w.record);
        }
        // This transaction changed redb outside `latest`: states read before now are stale.
        // (After the cache holds the new records: a read that starts in the next epoch must
        // not find an older one there.)
        self.engine.overlay.next_epoch();
        Ok(value)
    }

    /// A durable redb commit; the log is rewound after it.
    pub(crate) fn checkpoint(&mut self) -> Result<(), Error> {
        self.transact(CommitKind::Durable, |_, _, _, _| Ok(Ok(())))
    }

    /// Starts a checkpoint whose durable commit runs on its own thread (waiting first for the
    /// previous one, if it still runs: the only time the writer waits for a checkpoint).
    ///
    /// The writer syncs and answers every frame written, applies them and commits the
    /// applier's transaction (as every flush does: the overlay moves to the cache), so redb's
    /// last commit holds exactly the frames of the current region. It then opens the
    /// checkpoint's transaction (no other can be open: the applier's next one waits for it),
    /// records there the last frame, the next fencing token, and where the frames after it
    /// go (the other region, under the next salt, durable since the last checkpoint) with a
    /// new next salt, and moves new frames to that region. The thread makes it durable;
    /// batches after the switch are decided against the writer's `latest` and the overlay,
    /// which keep them until the first flush after the commit.
    pub(crate) fn start_checkpoint(&mut self) -> Result<(), Error> {
        self.flush()?;
        let txn = match self.begin(redb::Durability::Immediate) {
            Ok(txn) => txn,
            Err(error) => return Err(self.fail(error)),
        };
        let last = self.wal.last_seq();
        let following = new_salt();
        let (start, salt) = self.wal.switch(following, self.schedule.checkpoint_bytes);
        let recorded = Tables::open(&txn).and_then(|mut t| {
            t.set_wal_seq(last)?;
            t.set_next_token(self.next_token)?;
            t.set_log_region(start, salt, following)
        });
        if let Err(error) = recorded {
            return Err(self.fail(error));
        }
        let engine = std::sync::Arc::clone(&self.engine);
        self.engine.checkpoint.begin();
        let spawned = std::thread::Builder::new()
            .name("idemstore-checkpoint".into())
            .spawn(move || {
                engine.checkpoint.run_hook();
                let committed = txn
                    .commit()
                    .map_err(|e| Error::storage("committing a checkpoint", e));
                if let Err(error) = &committed {
                    // Before the applier may open a transaction (which redb then refuses).
                    engine.poison.set(error);
                }
                engine.checkpoint.end();
                committed
            });
        match spawned {
            Ok(thread) => {
                self.checkpointing = Some(thread);
                self.last_checkpoint = Instant::now();
                #[cfg(feature = "tracing")]
                tracing::debug!(
                    last,
                    start,
                    "idemstore checkpoint: frames go to the other log region; durable commit started"
                );
                Ok(())
            }
            Err(e) => {
                self.engine.checkpoint.end();
                Err(self.fail(Error::io("starting a checkpoint thread", e)))
            }
        }
    }

    /// Ends the background checkpoint, if one runs: waits for its commit when `wait` (and
    /// otherwise returns at once if it still runs). Once the commit is durable the region it
    /// covers may be written again; a failed commit poisons the store (the log still holds
    /// every frame, so the next open replays them).
    pub(crate) fn finish_checkpoint(&mut self, wait: bool) -> Result<(), Error> {
        let Some(running) = self.checkpointing.take() else {
            return Ok(());
        };
        if !wait && !running.is_finished() {
            self.checkpointing = Some(running);
            return Ok(());
        }
        let outcome = running.join().unwrap_or_else(|_| {
            Err(Error::storage(
                "committing a checkpoint",
                std::io::Error::other("the checkpoint thread panicked"),
            ))
        });
        match outcome {
            Ok(()) => {
                self.engine.counters.add(Counter::Commits, 1);
                self.engine.counters.add(Counter::Checkpoints, 1);
                self.wal.release();
                self.engine.poison.set_replay(self.wal.unreplayed());
                Ok(())
            }
            Err(error) => Err(self.fail(error)),
        }
    }
}
