//! Retention per operation: how long a completed key of each operation is kept, with the
//! store's [`Builder::retention`] as the default.
//!
//! A service rarely wants one retention for everything: payments keep their keys for days, a
//! queue's dedup window is minutes. The retention is looked up by the key's operation part
//! when a key is reserved, extended or completed, and written into the record as its own
//! deadline (`expires_at`), so sweeping, [`Store::counts`](crate::Store::counts) and listing
//! expired records follow each key's deadline without knowing the setting. A completion may
//! override it for one key ([`Store::complete_with_retention`](crate::Store::complete_with_retention)),
//! and [`Store::observe`](crate::Store::observe) takes its window per call.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::builder::Builder;
use crate::clock::duration_millis;
use crate::decide::Policy;
use crate::error::Error;
use crate::key::{Key, MAX_KEY_PART_LEN};
use crate::record::Millis;

/// The decision policy of every key: the store's, with a retention per operation.
#[derive(Debug, Clone)]
pub(crate) struct Policies {
    default: Policy,
    by_operation: Arc<HashMap<Vec<u8>, Millis>>,
}

impl Policies {
    /// The store's policies from its builder (validated by [`validate`]).
    pub(crate) fn of(builder: &Builder) -> Policies {
        Policies {
            default: Policy {
                lease: duration_millis(builder.lease),
                retention: duration_millis(builder.retention),
            },
            by_operation: Arc::new(
                builder
                    .retention_by_operation
                    .iter()
                    .map(|(operation, retention)| (operation.clone(), duration_millis(*retention)))
                    .collect(),
            ),
        }
    }

    /// The policy that decides `key`.
    pub(crate) fn for_key(&self, key: &Key) -> Policy {
        if self.by_operation.is_empty() {
            return self.default;
        }
        match self.by_operation.get(key.operation()) {
            Some(&retention) => Policy {
                retention,
                ..self.default
            },
            None => self.default,
        }
    }
}

impl Builder {
    /// How long completed keys of `operation` (the middle part of a [`Key`]) are kept,
    /// instead of [`retention`](Builder::retention): payments for days, a dedup window for
    /// minutes. Also how long an abandoned reservation of that operation is kept after its
    /// lease ran out. Setting an operation again replaces its retention. At least 1 ms.
    /// Default = none: every operation uses [`retention`](Builder::retention).
    ///
    /// Each record carries its own deadline, written when it is completed; changing the
    /// setting later does not move the deadline of keys already completed.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idemstore::{Fingerprint, Key, Reservation, Store};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::builder()
    ///     .retention(Duration::from_secs(24 * 3600))
    ///     .retention_for("POST /charges", Duration::from_secs(7 * 24 * 3600))
    ///     .retention_for("consume", Duration::from_secs(5 * 60))
    ///     .open(dir.path().join("keys.idem"))?;
    /// let key = Key::new("user-7", "POST /charges", "k1")?;
    /// let Reservation::Acquired(lease) = store.reserve(&key, Fingerprint::of(b"amount=5"))? else {
    ///     unreachable!("a fresh key is acquired")
    /// };
    /// store.complete(&lease, b"201".to_vec())?;
    /// let Reservation::Completed(done) = store.reserve(&key, Fingerprint::of(b"amount=5"))? else {
    ///     unreachable!("a completed key is replayed")
    /// };
    /// let kept = done.expires_at.duration_since(done.completed_at)?;
    /// assert_eq!(kept, Duration::from_secs(7 * 24 * 3600));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn retention_for(&mut self, operation: impl AsRef<[u8]>, retention: Duration) -> &mut Self {
        let operation = operation.as_ref().to_vec();
        self.retention_by_operation
            .retain(|(name, _)| *name != operation);
        self.retention_by_operation.push((operation, retention));
        self
    }
}

/// Checks the per-operation retentions of `builder`.
pub(crate) fn validate(builder: &Builder) -> Result<(), Error> {
    for (operation, retention) in &builder.retention_by_operation {
        let name = String::from_utf8_lossy(operation);
        let reason = if operation.is_empty() || operation.len() > MAX_KEY_PART_LEN {
            format!(
                "operation {name:?} is {} bytes; a key's operation has 1 to {MAX_KEY_PART_LEN} bytes",
                operation.len()
            )
        } else if duration_millis(*retention) < 1 {
            format!("the retention of operation {name:?} must be at least 1 ms")
        } else {
            continue;
        };
        return Err(Error::InvalidConfig {
            setting: "retention_for",
            reason,
        });
    }
    Ok(())
}
