//! `expire`: deleting a key now, by a caller or an operator, through the same state machine
//! and commit path as every other write.

use crate::answers::LiveLease;
use crate::commit::first;
use crate::decide::answer;
use crate::decide::{Expire, Expired};
use crate::error::Error;
use crate::key::Key;
use crate::record::RecordClass;
use crate::state::Counter;

use super::Store;

impl Store {
    /// Deletes whatever is stored for `key`, now: the key then reads as absent and the next
    /// reserve acquires it afresh, with a new token. Returns the class of the record that was
    /// removed (completed, needs-review, stale, or expired but not yet swept), or `None` when
    /// nothing was stored. A key that a live lease holds is refused; see
    /// [`expire_forced`](Store::expire_forced).
    ///
    /// Where it fits:
    /// - **a wrong stored response**: the result of a completed key must stop being
    ///   replayed; the next request with the key does the work again and stores a new one.
    ///   A key still in progress has no stored response yet, hence the refusal.
    /// - **reprocessing on purpose**: drop a consumer's dedup entry
    ///   ([`observe`](Store::observe)) so a message is processed again when redelivered;
    ///   [`expire_many`](Store::expire_many) for a batch.
    /// - **data deletion**: see [`expire_forced`](Store::expire_forced).
    ///
    /// ```
    /// use idemstore::{Fingerprint, Key, RecordClass, Reservation, Store};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("keys.idem"))?;
    /// let key = Key::new("user-7", "POST /charges", "k1")?;
    /// let fp = Fingerprint::of(b"amount=5");
    /// let Reservation::Acquired(lease) = store.reserve(&key, fp)? else { unreachable!() };
    /// store.complete(&lease, b"500 wrong answer".to_vec())?;
    /// assert_eq!(store.expire(&key)?, Some(RecordClass::Completed));
    /// let Reservation::Acquired(again) = store.reserve(&key, fp)? else {
    ///     unreachable!("an expired key is acquired afresh")
    /// };
    /// assert!(again.token() > lease.token());
    /// // The new holder is at work: a plain expire is refused, naming the end of its lease.
    /// let Err(refused) = store.expire(&key) else { unreachable!("a live lease is refused") };
    /// assert!(matches!(refused, idemstore::Error::LeaseLive { .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Durability
    /// Logged and synced like a completion: once this returns, the key stays expired across
    /// a crash and never comes back from the log.
    ///
    /// # Errors
    /// [`Error::LeaseLive`] naming the lease's end when a live lease holds the key (nothing
    /// is changed); [`StorageError::Corruption`](crate::StorageError::Corruption) when its record is damaged; storage errors and
    /// [`StorageError::Poisoned`](crate::StorageError::Poisoned) as for [`reserve`](Store::reserve).
    pub fn expire(&self, key: &Key) -> Result<Option<RecordClass>, Error> {
        self.expire_one(key, LiveLease::Refuse)
    }

    /// [`expire`](Store::expire), also when a live lease holds the key: the holder's later
    /// [`complete`](Store::complete), [`extend`](Store::extend) and the other lease
    /// operations fail with [`Error::LeaseLost`] and change nothing
    /// ([`release_if_pending`](Store::release_if_pending) answers `Ok(false)`, nothing
    /// released, while the key is absent, as after a sweep, and `LeaseLost` once another
    /// caller holds it). The next reserve gets a newer token than the holder's, so fencing
    /// keeps work that the holder is still doing from landing on top of the new owner's.
    ///
    /// Where it fits: **data deletion** (a user's erasure request must be honoured whatever
    /// state the key is in). The record's bytes leave the B-tree at once; the log and freed
    /// pages of the file keep old bytes until they are overwritten: call
    /// [`checkpoint`](Store::checkpoint) afterwards to make the deletion part of the file and
    /// rewind the log.
    ///
    /// # Durability
    /// As for [`expire`](Store::expire).
    ///
    /// # Errors
    /// As for [`expire`](Store::expire), without [`Error::LeaseLive`].
    pub fn expire_forced(&self, key: &Key) -> Result<Option<RecordClass>, Error> {
        self.expire_one(key, LiveLease::Take)
    }

    fn expire_one(&self, key: &Key, live: LiveLease) -> Result<Option<RecordClass>, Error> {
        let outcome = self.committer.submit_one(key.clone(), op(live))?;
        self.expired(key, outcome)
    }

    /// An expire's answer, counted in [`Stats::expired`](crate::Stats::expired).
    fn expired(&self, key: &Key, outcome: Expired) -> Result<Option<RecordClass>, Error> {
        let answer = answer::expired(key, outcome);
        if let Ok(Some(_)) = answer {
            self.engine.counters.add(Counter::Expired, 1);
        }
        answer
    }

    /// Expires many keys with one shared commit (one log sync). Returns one result per key,
    /// in order; a key refused for its live lease ([`LiveLease::Refuse`]) or with a damaged
    /// record fails alone.
    ///
    /// # Durability
    /// As for [`expire`](Store::expire), for every key answered `Ok`.
    ///
    /// # Errors
    /// The outer error is a failure of the whole batch (a poisoned store, a failed sync).
    pub fn expire_many(
        &self,
        keys: &[Key],
        live: LiveLease,
    ) -> Result<Vec<Result<Option<RecordClass>, Error>>, Error> {
        let ops = keys.iter().map(|key| (key.clone(), op(live))).collect();
        Ok(self
            .committer
            .submit(ops)?
            .into_iter()
            .zip(keys)
            .map(|(outcome, key)| outcome.and_then(|outcome| self.expired(key, outcome)))
            .collect())
    }

    /// [`expire_many`](Store::expire_many) for async code; no thread blocks while the batch
    /// is synced.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the expiries: they may still be committed.
    ///
    /// # Errors
    /// As for [`expire_many`](Store::expire_many).
    pub async fn expire_many_async(
        &self,
        keys: &[Key],
        live: LiveLease,
    ) -> Result<Vec<Result<Option<RecordClass>, Error>>, Error> {
        let ops = keys.iter().map(|key| (key.clone(), op(live))).collect();
        Ok(self
            .committer
            .submit_async(ops)
            .await?
            .into_iter()
            .zip(keys)
            .map(|(outcome, key)| outcome.and_then(|outcome| self.expired(key, outcome)))
            .collect())
    }

    /// [`expire`](Store::expire) or [`expire_forced`](Store::expire_forced) for async code;
    /// no thread blocks while the expiry is synced.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the expiry: it may still be committed.
    ///
    /// # Errors
    /// As for [`expire`](Store::expire).
    pub async fn expire_async(
        &self,
        key: &Key,
        live: LiveLease,
    ) -> Result<Option<RecordClass>, Error> {
        let answer = self
            .committer
            .submit_async(vec![(key.clone(), op(live))])
            .await;
        self.expired(key, first(answer)?)
    }
}

fn op(live: LiveLease) -> Expire {
    Expire {
        force: live == LiveLease::Take,
    }
}
