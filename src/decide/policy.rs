//! Retention per operation: how long a completed key of each operation is kept, with the
//! store's [`Builder::retention`](crate::Builder::retention) as the default.
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

use crate::clock::duration_millis;
use crate::decide::Policy;
use crate::key::Key;
use crate::record::{Millis, TokenFloor};

/// The decision policy of every key: the store's, with a retention per operation.
#[derive(Debug, Clone)]
pub(crate) struct Policies {
    default: Policy,
    by_operation: Arc<HashMap<Vec<u8>, Millis>>,
}

impl Policies {
    /// The policies of a store with these settings (validated by the builder): `lease` and
    /// `retention` for every key, `retention` replaced per operation by `by_operation`, and
    /// the owner's token `floor`.
    pub(crate) fn new(
        lease: Duration,
        retention: Duration,
        by_operation: &[(Vec<u8>, Duration)],
        floor: TokenFloor,
    ) -> Policies {
        Policies {
            default: Policy {
                lease: duration_millis(lease),
                retention: duration_millis(retention),
                floor,
            },
            by_operation: Arc::new(
                by_operation
                    .iter()
                    .map(|(operation, retention)| (operation.clone(), duration_millis(*retention)))
                    .collect(),
            ),
        }
    }

    /// The owner's token floor: pending records below it are stale.
    pub(crate) fn floor(&self) -> TokenFloor {
        self.default.floor
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
