//! Background work between batches: forgetting what the applier's commits hold, syncing a
//! buffered log, sweeping expired records in slices, checkpointing when the log is large or
//! old.

use std::time::{Duration, Instant};

use crate::state::Durability;

use super::apply::TXN_SPAN;
use super::{CommitKind, Writer};

/// How old the first change no redb commit holds may grow before the writer commits it
/// itself: the applier commits every [`TXN_SPAN`], so this is reached only when it could not
/// (it fell far behind).
const STALE_SPAN: Duration = Duration::from_millis(4 * TXN_SPAN.as_millis() as u64);

/// Background-work settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    pub(crate) durability: Durability,
    pub(crate) checkpoint_bytes: u64,
    pub(crate) checkpoint_interval: Duration,
    /// Sweep expired records in the background this often (`None`: only when asked).
    pub(crate) sweep_interval: Option<Duration>,
    /// The background work runs only as a test's steps ([`Background`]): no applier thread,
    /// and nothing between batches.
    pub(crate) manual: bool,
}

/// One step of the engine's background work, run when a test asks
/// (`Store::__background`, feature `__whitebox`) in a store whose background work is manual
/// (`Builder::__manual_background`): what the applier thread, the committer between batches,
/// the checkpoint thread and the sweeper do by themselves in every other store.
#[cfg(feature = "__whitebox")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Background {
    /// The applier applies the durable batches queued for it to its open transaction (and
    /// deletes the windows that have ended, when the sweeper is on).
    Apply,
    /// The applier applies (and merges the closed narrow windows), then commits its open
    /// transaction, as it does every `TXN_SPAN`.
    /// The writer hears of the commit at its next batch, or at [`Background::WriterDrain`].
    ApplierCommit,
    /// The writer forgets the changes the applier's commits hold and ends the epoch (what it
    /// does before every batch and between batches).
    WriterDrain,
    /// The applier moves the overlay entries the writer let go to the record cache.
    DrainOverlay,
    /// A background checkpoint starts: its durable commit runs on its own thread while the
    /// next operations run.
    CheckpointStart,
    /// The writer waits for the running background checkpoint, if any, to end.
    CheckpointFinish,
    /// The windows that have ended are deleted (the sweeper's work).
    DropEndedWindows,
    /// The writer commits everything to redb itself (what it does before a sweep, a
    /// `complete_with` or a checkpoint).
    Flush,
}

#[cfg(feature = "__whitebox")]
impl Background {
    /// Every step.
    pub const ALL: [Background; 8] = [
        Background::Apply,
        Background::ApplierCommit,
        Background::WriterDrain,
        Background::DrainOverlay,
        Background::CheckpointStart,
        Background::CheckpointFinish,
        Background::DropEndedWindows,
        Background::Flush,
    ];
}

impl Writer {
    /// Forgets what the applier's commits hold, commits itself only when the applier has not
    /// for long, syncs a buffered log when its interval passed, and checkpoints when the log
    /// is large or old.
    pub(super) fn background_work(&mut self) {
        if self.schedule.manual || self.engine.poison.check().is_err() {
            return;
        }
        if self.finish_checkpoint(false).is_err() {
            return;
        }
        self.drain_committed();
        let stale = self
            .unflushed_since
            .is_some_and(|since| since.elapsed() >= STALE_SPAN);
        let sync_due = match self.schedule.durability {
            Durability::Buffered { flush_interval } => self.last_sync.elapsed() >= flush_interval,
            Durability::Immediate => false,
        };
        if self.checkpointing.is_some() || !stale {
            // While a checkpoint commits, the applier's transaction waits for it, so the
            // writer does not commit (nor sweep) until it is durable. Otherwise the applier
            // commits its own transaction. A buffered log is synced either way.
            if sync_due {
                if let Err(error) = self.syncer.drive_all() {
                    let _ = self.fail(error);
                    return;
                }
                self.last_sync = Instant::now();
            }
            if self.checkpointing.is_some() {
                return;
            }
        } else {
            let _ = self.flush();
        }
        if let Some(interval) = self.schedule.sweep_interval {
            if self.last_sweep.elapsed() >= interval {
                self.last_sweep = Instant::now();
                // Ended windows are known without a transaction. While the applier holds one,
                // it deletes them itself when it commits; otherwise they go here. (Narrow
                // windows are merged by the applier alone, off the writer's thread.)
                let ended = !self.engine.windows.due(self.engine.now()).is_empty();
                if ended && self.applier.is_idle() {
                    let _ = self.drop_ended_windows();
                }
            }
        }
        let logged = self.wal.len_since_rewind();
        if logged >= self.schedule.checkpoint_bytes
            || (logged > 0 && self.last_checkpoint.elapsed() >= self.schedule.checkpoint_interval)
        {
            let _ = self.start_checkpoint();
        }
    }

    /// How long the committer may sleep before background work is due; `None` when none is.
    pub(super) fn next_tick(&self) -> Option<Duration> {
        if self.schedule.manual || self.engine.poison.check().is_err() {
            return None;
        }
        let mut due: Option<Duration> = None;
        let mut at = |d: Duration| due = Some(due.map_or(d, |x| x.min(d)));
        if self.checkpointing.is_some() {
            // Polled until its commit is durable (then the region it covers is free again and
            // the transaction can be committed).
            at(Duration::from_millis(2));
        } else if let Some(since) = self.unflushed_since {
            // The applier's commit is due about TXN_SPAN after the first change: look for it
            // then, and every few milliseconds until it came (or the writer must commit).
            let elapsed = since.elapsed();
            at(if elapsed < TXN_SPAN {
                TXN_SPAN - elapsed
            } else {
                Duration::from_millis(5).min(STALE_SPAN.saturating_sub(elapsed))
            });
        }
        if let Some(interval) = self.schedule.sweep_interval {
            at(interval.saturating_sub(self.last_sweep.elapsed()));
        }
        if self.wal.len_since_rewind() > 0 {
            at(self
                .schedule
                .checkpoint_interval
                .saturating_sub(self.last_checkpoint.elapsed()));
            if let Durability::Buffered { flush_interval } = self.schedule.durability {
                at(flush_interval.saturating_sub(self.last_sync.elapsed()));
            }
        }
        due.map(|d| d.max(Duration::from_millis(1)))
    }

    /// Runs one step of the background work (see [`Background`]).
    #[cfg(feature = "__whitebox")]
    pub(crate) fn run_background(&mut self, step: Background) -> Result<(), crate::error::Error> {
        self.engine.poison.check()?;
        match step {
            Background::Apply => {
                let mut txn = self.applier.txn.lock();
                let applied = self.applier.apply_queued(&mut txn);
                if let Err(error) = &applied {
                    self.applier.fail(&mut txn, error);
                }
                applied
            }
            Background::ApplierCommit => self.applier.commit_now(),
            Background::WriterDrain => {
                self.drain_committed();
                Ok(())
            }
            Background::DrainOverlay => {
                self.applier.drain_overlay_now();
                Ok(())
            }
            Background::CheckpointStart => self.start_checkpoint(),
            Background::CheckpointFinish => self.finish_checkpoint(true),
            Background::DropEndedWindows => self.drop_ended_windows().map(|_| ()),
            Background::Flush => self.flush(),
        }
    }

    /// On shutdown: make everything durable in redb, marked as closed cleanly, so the next
    /// open neither replays nor reads the log (see `clean_close.rs`).
    pub(super) fn close(&mut self) {
        if self.engine.poison.check().is_ok() {
            let _ = self.flush();
            // The last checkpoint: a durable commit that holds every frame and carries the
            // clean-close mark.
            let _ = self.transact(CommitKind::Durable, |_, txn, _, _| {
                crate::log::mark(txn).map(Ok).map_err(Into::into)
            });
        }
    }
}
