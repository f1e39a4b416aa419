//! Background work between batches: committing the open transaction, syncing a buffered
//! log, sweeping expired records in slices, checkpointing when the log is large or old.

use std::time::{Duration, Instant};

use crate::engine::settings::Durability;
use crate::engine::sweep::SWEEP_SLICE_RECORDS;

use super::writer::TXN_SPAN;
use super::Writer;

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
    /// Commits the open transaction when it is old, syncs a buffered log when its interval
    /// passed, and checkpoints when the log is large or old.
    pub(super) fn background_work(&mut self) {
        if self.engine.poison.check().is_err() {
            return;
        }
        if self.finish_checkpoint(false).is_err() {
            return;
        }
        let txn_due = self
            .unflushed_since
            .is_some_and(|since| since.elapsed() >= TXN_SPAN);
        let sync_due = match self.schedule.durability {
            Durability::Buffered { flush_interval } => self.last_sync.elapsed() >= flush_interval,
            Durability::Immediate => false,
        };
        if self.checkpointing.is_some() {
            // A checkpoint commits: the applier's transaction waits for it, so the writer does
            // not commit (nor sweep) until it is durable; a buffered log is still synced.
            if sync_due {
                if let Err(error) = self.syncer.drive_all() {
                    let _ = self.fail(error);
                    return;
                }
                self.last_sync = Instant::now();
            }
            return;
        }
        if txn_due || sync_due {
            let _ = self.flush();
        }
        if let Some(interval) = self.schedule.sweep_interval {
            if self.sweep_backlog || self.last_sweep.elapsed() >= interval {
                self.last_sweep = Instant::now();
                self.sweep_backlog =
                    matches!(self.sweep(SWEEP_SLICE_RECORDS), Ok(n) if n == SWEEP_SLICE_RECORDS);
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
            at(TXN_SPAN.saturating_sub(since.elapsed()));
        }
        if let Some(interval) = self.schedule.sweep_interval {
            at(if self.sweep_backlog {
                Duration::ZERO
            } else {
                interval.saturating_sub(self.last_sweep.elapsed())
            });
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
            let _ = self.checkpoint_and_mark_clean();
        }
    }
}
