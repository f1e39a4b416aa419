//! Per-call retentions: completing or resolving one key with its own retention instead of
//! its operation's (see `decide/policy.rs` for the per-operation setting).

use std::time::Duration;

use crate::answers::Lease;
use crate::clock::duration_millis;
use crate::commit::first;
use crate::decide::answer;
use crate::decide::Resolution;
use crate::decide::{Complete, Resolve, WithRetention};
use crate::error::Error;
use crate::key::Key;

use super::Store;

impl Store {
    /// [`complete`](Store::complete), keeping this key's result for `retention` instead of
    /// its operation's retention ([`Builder::retention_for`](crate::Builder::retention_for),
    /// else [`Builder::retention`](crate::Builder::retention)). A zero retention stores the
    /// completion and lets the key read as absent at once.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idemstore::{Fingerprint, Key, Reservation, Store};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("keys.idem"))?;
    /// let key = Key::new("user-7", "export", "k1")?;
    /// let Reservation::Acquired(lease) = store.reserve(&key, Fingerprint::of(b"all"))? else {
    ///     unreachable!()
    /// };
    /// // A large export link is only worth replaying for an hour.
    /// store.complete_with_retention(&lease, b"https://...".to_vec(), Duration::from_secs(3600))?;
    /// let record = store.get(&key)?.expect("completed");
    /// assert!(record.expires_at().is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Durability
    /// As for [`complete`](Store::complete).
    ///
    /// # Errors
    /// As for [`complete`](Store::complete).
    pub fn complete_with_retention(
        &self,
        lease: &Lease,
        result: impl Into<Vec<u8>>,
        retention: Duration,
    ) -> Result<(), Error> {
        let result = result.into();
        self.check_result(lease, &result)?;
        let op = WithRetention {
            op: Complete {
                token: lease.token,
                result,
            },
            retention: duration_millis(retention),
        };
        answer::completion(lease, self.committer.submit_one(lease.key.clone(), op)?)
    }

    /// [`resolve`](Store::resolve); a [`Resolution::Complete`] result is kept for
    /// `retention` instead of the key's operation's retention.
    ///
    /// # Errors
    /// As for [`resolve`](Store::resolve).
    pub fn resolve_with_retention(
        &self,
        key: &Key,
        resolution: Resolution,
        retention: Duration,
    ) -> Result<(), Error> {
        self.check_resolution(key, &resolution)?;
        let op = WithRetention {
            op: Resolve(resolution),
            retention: duration_millis(retention),
        };
        answer::resolved(key, self.committer.submit_one(key.clone(), op)?)
    }

    /// [`complete_with_retention`](Store::complete_with_retention) for async code; no thread
    /// blocks while the completion is synced.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the completion: it may still be committed.
    ///
    /// # Errors
    /// As for [`complete`](Store::complete).
    pub async fn complete_with_retention_async(
        &self,
        lease: &Lease,
        result: impl Into<Vec<u8>>,
        retention: Duration,
    ) -> Result<(), Error> {
        let result = result.into();
        self.check_result(lease, &result)?;
        let op = WithRetention {
            op: Complete {
                token: lease.token,
                result,
            },
            retention: duration_millis(retention),
        };
        let outcome = self
            .committer
            .submit_async(vec![(lease.key.clone(), op)])
            .await;
        answer::completion(lease, first(outcome)?)
    }

    /// [`resolve_with_retention`](Store::resolve_with_retention) for async code; no thread
    /// blocks while the resolution is synced.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the resolution: it may still be committed.
    ///
    /// # Errors
    /// As for [`resolve`](Store::resolve).
    pub async fn resolve_with_retention_async(
        &self,
        key: &Key,
        resolution: Resolution,
        retention: Duration,
    ) -> Result<(), Error> {
        self.check_resolution(key, &resolution)?;
        let op = WithRetention {
            op: Resolve(resolution),
            retention: duration_millis(retention),
        };
        let outcome = self.committer.submit_async(vec![(key.clone(), op)]).await;
        answer::resolved(key, first(outcome)?)
    }
}
