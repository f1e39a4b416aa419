//! [`EtcdStore::expire`]: deleting a key now, through the same `Expire` transition and the
//! same conditional write as every other operation.

use super::store::EtcdStore;
use crate::answers::LiveLease;
use crate::decide::answer;
use crate::decide::expire::Expire;
use crate::error::Error;
use crate::key::Key;
use crate::record::RecordClass;

impl EtcdStore {
    /// Deletes whatever is stored for `key`, now; see [`Store::expire`](crate::Store::expire).
    /// The record is deleted (its index entries are spent; sweeping deletes them) in one
    /// transaction that applies only if the record is unchanged since it was read (else the
    /// decision is made again on what changed). A record past its expiry that no sweep
    /// deleted yet is deleted too. The next reserve acquires the key afresh with a higher token (a later revision).
    ///
    /// # Durability
    /// Answered only after a majority of the cluster's members wrote the deletion to disk.
    ///
    /// # Errors
    /// [`Error::LeaseLive`] naming the lease's end when a live lease holds the key (nothing
    /// is changed); [`StorageError::Corruption`](crate::StorageError::Corruption) for a damaged record; [`Error::Cluster`] when the
    /// cluster gave no definite answer within the operation deadline.
    pub async fn expire(&self, key: &Key) -> Result<Option<RecordClass>, Error> {
        self.expire_with(key, LiveLease::Refuse).await
    }

    /// [`expire`](EtcdStore::expire), also when a live lease holds the key; see
    /// [`Store::expire_forced`](crate::Store::expire_forced). The holder is fenced: its later
    /// complete, extend and review fail with [`Error::LeaseLost`] and change nothing, and the
    /// next acquisition's token is higher than the holder's.
    ///
    /// # Errors
    /// As for [`expire`](EtcdStore::expire), without [`Error::LeaseLive`].
    pub async fn expire_forced(&self, key: &Key) -> Result<Option<RecordClass>, Error> {
        self.expire_with(key, LiveLease::Take).await
    }

    /// [`expire`](EtcdStore::expire) or [`expire_forced`](EtcdStore::expire_forced), as `live`
    /// says.
    ///
    /// # Errors
    /// As for [`expire`](EtcdStore::expire).
    pub async fn expire_with(
        &self,
        key: &Key,
        live: LiveLease,
    ) -> Result<Option<RecordClass>, Error> {
        let op = Expire {
            force: live == LiveLease::Take,
        };
        let outcome = self.inner().apply(key, op, &[]).await?;
        answer::expired(key, outcome)
    }
}
