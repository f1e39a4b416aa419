//! Checkpoints, and the other transactions outside the batch path.
//!
//! A checkpoint is a durable redb commit: it makes every batch applied so far durable in the
//! B-tree file (whose meta table records the last applied log frame and where the frames after
//! it are). The committer checkpoints when the log grows past
//! [`Builder::checkpoint_bytes`](crate::Builder::checkpoint_bytes) and when the oldest
//! un-checkpointed frame is older than
//! [`Builder::checkpoint_interval`](crate::Builder::checkpoint_interval), in the background
//! ([`Writer::start_checkpoint`]): the writer syncs the log, moves new frames to its other
//! region ([`Wal::switch`](crate::log::Wal::switch)), and hands the rest to a
//! checkpoint thread, which applies the region left to the applier's transaction and commits
//! it durably; the writer goes on deciding and logging batches meanwhile. The region left is
//! written again only once the commit is durable ([`Writer::finish_checkpoint`]).
//! [`Store::checkpoint`](crate::Store::checkpoint), `complete_with` and close commit durably
//! on the writer and rewind the log to its first region; sweeps commit unlogged.

use std::thread::JoinHandle;
use std::time::Instant;

use redb::WriteTransaction;

use super::apply::{Applier, OpenTxn};
use super::{Writer, Written};
use crate::error::{Error, StorageError};
use crate::log::LOG_HEADER_LEN;
use crate::record::Millis;
use crate::state::Counter;
use crate::state::{CheckpointStart, Engine};
use crate::tree::{new_salt, Tables};

/// A background checkpoint: its thread, which returns the commit's outcome.
pub(crate) type Running = JoinHandle<Result<(), Error>>;

/// What a background checkpoint records in the meta table: the last frame it covers, the
/// next fencing token then, and where the frames after it are (the other region's start, its
/// salt, and the salt of the region after).
struct CheckpointMeta {
    last: u64,
    next_token: u64,
    start: u64,
    salt: u64,
    following: u64,
}

/// A background checkpoint's commit, on its thread: applies the queued frames up to
/// `meta.last` (all durable, none after it: the applier holds those back) to the applier's
/// open transaction, records `meta` there and commits it durably. The applier's thread waits
/// meanwhile (the caller holds `txn`); the writer does not.
fn commit_checkpoint(
    engine: &Engine,
    applier: &Applier,
    txn: &mut OpenTxn,
    meta: CheckpointMeta,
) -> Result<(), Error> {
    engine.poison.check()?;
    if txn.is_none() {
        let ctx = "starting a checkpoint";
        let opened = engine
            .db
            .begin_write()
            .map_err(|e| StorageError::redb(ctx, e))?;
        *txn = Some((opened, Instant::now()));
    }
    applier.apply_merging(txn)?;
    let (mut open, _) = txn.take().expect("opened above");
    let ctx = "committing a checkpoint";
    open.set_durability(redb::Durability::Immediate)
        .map_err(|e| StorageError::redb(ctx, e))?;
    // As `Writer::begin` does for every durable commit.
    open.set_quick_repair(true);
    let mut tables = Tables::open(&open, &engine.windows)?;
    tables.save_filters()?;
    tables.set_wal_seq(meta.last)?;
    tables.set_next_token(meta.next_token)?;
    tables.set_log_region(meta.start, meta.salt, meta.following)?;
    drop(tables);
    open.commit().map_err(|e| StorageError::redb(ctx, e))?;
    applier.committed_all();
    Ok(())
}

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
                    return Err(
                        self.fail(StorageError::redb("rolling back a transaction", e).into())
                    );
                }
                return Err(refusal);
            }
            Err(error) => return Err(self.fail(error)),
        };
        let new_salt = new_salt();
        if self.next_token != token_before || kind == CommitKind::Durable {
            let saved = Tables::open(&txn, &self.engine.windows).and_then(|mut t| {
                t.set_next_token(self.next_token)?;
                if kind == CommitKind::Durable {
                    // Every durable commit saves the filters it would leave out of date.
                    t.save_filters()?;
                    // Frames after this checkpoint use a new salt, so no frame from before it
                    // (nor bytes shaped like one) can pass as current after the rewind. The
                    // next region's salt is unused still (no background checkpoint runs).
                    t.set_log_region(LOG_HEADER_LEN, new_salt, self.wal.next_salt())?;
                }
                Ok(())
            });
            if let Err(error) = saved {
                return Err(self.fail(error.into()));
            }
        }
        if let Err(e) = txn.commit() {
            return Err(self.fail(StorageError::redb("committing a write transaction", e).into()));
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
    /// The writer syncs and answers every frame written, moves new frames to the other region
    /// (under the next salt, durable since the last checkpoint) and tells the applier to
    /// apply no frame after the last one of the region left. The thread then applies what the
    /// applier has not of that region to the applier's open transaction, records there the
    /// last frame, the next fencing token, and where the frames after it go with a new next
    /// salt, and commits it durably; so the commit holds exactly the frames of the region
    /// left. Neither the applying nor the commit holds the writer: batches after the switch
    /// are decided against the writer's `latest` and the overlay, which keep them until a
    /// commit holds them ([`drain_committed`](Writer::drain_committed)).
    pub(crate) fn start_checkpoint(&mut self) -> Result<(), Error> {
        self.engine.poison.check()?;
        self.finish_checkpoint(true)?;
        // Every frame of the region left durable: the applier may then apply them all.
        if let Err(error) = self.syncer.drive_all() {
            return Err(self.fail(error));
        }
        self.last_sync = Instant::now();
        let last = self.wal.last_seq();
        let next_token = self.next_token;
        let following = new_salt();
        let (start, salt) = self.wal.switch(following, self.schedule.checkpoint_bytes);
        let hook = self.engine.checkpoint.take_hook(&CheckpointStart {
            back_to_first_region: self.wal.bounded(),
        });
        self.applier.hold_after(last);
        let engine = std::sync::Arc::clone(&self.engine);
        let applier = std::sync::Arc::clone(&self.applier);
        let spawned = std::thread::Builder::new()
            .name("idemstore-checkpoint".into())
            .spawn(move || {
                if let Some(hook) = hook {
                    hook();
                }
                let committed = {
                    let mut txn = applier.txn.lock();
                    let committed = commit_checkpoint(
                        &engine,
                        &applier,
                        &mut txn,
                        CheckpointMeta {
                            last,
                            next_token,
                            start,
                            salt,
                            following,
                        },
                    );
                    if let Err(error) = &committed {
                        // Before the applier may open a transaction (which redb then refuses).
                        engine.poison.set(error);
                        *txn = None;
                    }
                    committed
                };
                applier.release_hold();
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
                self.applier.release_hold();
                Err(self.fail(StorageError::io("starting a checkpoint thread", e).into()))
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
            Err(StorageError::redb(
                "committing a checkpoint",
                std::io::Error::other("the checkpoint thread panicked"),
            )
            .into())
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
