//! Checkpoints, and the other transactions outside the batch path.
//!
//! A checkpoint is a durable redb commit: it makes every batch applied so far durable in the
//! B-tree file (whose meta table records the last applied log frame), after which the log is
//! rewound and overwritten from its start. The committer checkpoints when the log grows past
//! [`Builder::checkpoint_bytes`](crate::Builder::checkpoint_bytes), when the oldest
//! un-checkpointed frame is older than
//! [`Builder::checkpoint_interval`](crate::Builder::checkpoint_interval), and on close.
//! `complete_with` commits the same way; sweeps commit unlogged.

use std::time::Instant;

use redb::WriteTransaction;

use super::{Writer, Written};
use crate::engine::stats::Counter;
use crate::error::Error;
use crate::format::tables::Tables;
use crate::record::Millis;

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
        let new_salt = crate::format::tables::new_salt();
        if self.next_token != token_before || kind == CommitKind::Durable {
            let saved = Tables::open(&txn).and_then(|mut t| {
                t.set_next_token(self.next_token)?;
                if kind == CommitKind::Durable {
                    // Frames after this checkpoint use a new salt, so no frame from before it
                    // (nor bytes shaped like one) can pass as current after the rewind.
                    t.set_log_salt(new_salt)?;
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
}
