//! Background work between batches: forgetting what the applier's commits hold, syncing a
//! buffered log, sweeping expired records in slices, checkpointing when the log is large or
//! old.

use std::time::{Duration, Instant};

use crate::state::settings::Durability;

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
}

impl Writer {
    /// Forgets what the applier's commits hold, commits itself only when the applier has not
    /// for long, syncs a buffered log when its interval passed, and checkpoints when the log
    /// is large or old.
    pub(super) fn background_work(&mut self) {
        if self.engine.poison.check().is_err() {
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
                // it deletes them itself when it commits; otherwise they go here.
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
        if self.engine.poison.check().is_err() {
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

    /// On shutdown: make everything durable in redb, marked as closed cleanly, so the next
    /// open neither replays nor reads the log (see `clean_close.rs`).
    pub(super) fn close(&mut self) {
        if self.engine.poison.check().is_ok() {
            let _ = self.flush();
            // The last checkpoint: a durable commit that holds every frame and carries the
            // clean-close mark.
            let _ = self.transact(CommitKind::Durable, |_, txn, _, _| {
                crate::log::clean_close::mark(txn).map(Ok)
            });
        }
    }
}
