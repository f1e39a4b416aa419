//! [`EtcdStore`]: the key-reservation operations on an etcd v3 cluster.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, TxnOp};

use super::builder::EtcdBuilder;
use super::hints::Hints;
use super::layout::Layout;
use crate::answers::Lease;
use crate::clock::{to_millis, Clock};
use crate::decide::answer;
use crate::decide::Policies;
use crate::decide::{Completion, Extend, Operation, Reserve, Reserved};
use crate::error::{Error, LeaseLostReason};
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::record::{Millis, Record};
use crate::remote::Backend;

/// The shared state of an [`EtcdStore`] and its clones.
pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) layout: Layout,
    pub(crate) policies: Policies,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) max_result_len: usize,
    pub(crate) max_txn_ops: usize,
    pub(crate) op_deadline: Duration,
    pub(crate) store_id: u64,
    pub(crate) writes: AtomicU64,
    /// Requests sent again after an error or a timeout.
    pub(crate) resends: AtomicU64,
    /// The pending records this process wrote last (guesses that save a read).
    pub(crate) hints: Hints,
}

impl Inner {
    pub(crate) fn now(&self) -> Millis {
        to_millis(self.clock.now())
    }

    /// An acquisition's lease as it is answered. A lease is counted from when the acquisition
    /// was decided, before its transaction was sent; when the write landed late (resent
    /// after a lost answer, or held up by an election) less than half of it may be left, or
    /// none, although the key became the caller's only when the write landed, and an earlier
    /// owner's lease may have run until shortly before. Such a lease is extended once more
    /// (one more transaction, under the same compare as every write), so that the caller's
    /// lease counts from after the key was its own. A record that had already expired when
    /// it landed reads as absent (anyone may acquire it): the reserve is then decided again
    /// on what the key holds now. If the key was taken over meanwhile, or the cluster gives
    /// no answer to the extension, the lease is answered as written: the caller holds the
    /// token, and fencing refuses its writes once a newer token holds the key.
    pub(crate) async fn fresh_lease(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        reserved: Reserved,
    ) -> Result<Reserved, Error> {
        let Reserved::Acquired {
            token,
            attempt,
            lease_until,
            progress,
        } = reserved
        else {
            return Ok(reserved);
        };
        let lease = self.policies.for_key(key).lease;
        let lease_until = if lease_until.saturating_sub(self.now()) >= lease / 2 {
            lease_until
        } else {
            match Box::pin(self.apply(key, Extend { token }, &[])).await {
                Ok(Ok(extended)) => extended,
                Ok(Err(LeaseLostReason::Gone)) => {
                    let op = Reserve { fingerprint };
                    return Box::pin(self.apply(key, op, &[])).await;
                }
                Ok(Err(_)) | Err(_) => lease_until,
            }
        };
        Ok(Reserved::Acquired {
            token,
            attempt,
            lease_until,
            progress,
        })
    }
}

impl Backend for Inner {
    fn now(&self) -> Millis {
        Inner::now(self)
    }

    fn max_result_len(&self) -> usize {
        self.max_result_len
    }

    async fn decide_write<O>(
        &self,
        key: &Key,
        op: O,
        absent_first: bool,
    ) -> Result<O::Outcome, Error>
    where
        O: Operation + Clone + Sync,
    {
        let start = self.start(key, absent_first);
        self.apply_from(key, op, &[], start).await
    }

    async fn decide_write_many<O>(
        &self,
        items: &[(Key, O)],
        absent_first: bool,
    ) -> Result<Vec<Result<O::Outcome, Error>>, Error>
    where
        O: Operation + Clone + Sync,
    {
        self.apply_many(items, absent_first).await
    }

    async fn read_record(&self, key: &Key) -> Result<Option<Record>, Error> {
        Ok(self.read(key).await?.map(|stored| stored.record))
    }

    async fn acquired(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        reserved: Reserved,
    ) -> Result<Reserved, Error> {
        self.fresh_lease(key, fingerprint, reserved).await
    }
}

/// A key-reservation store on an etcd v3 cluster (feature `etcd`): the operations and answers
/// of [`Store`](crate::Store), shared by every instance of a service on every host.
///
/// Every transition is the same `decide` function as the local store's:
/// the record is read, the decision is made, and the change is written in one etcd
/// transaction that applies only if the record's `mod_revision` is still the one read (or, for
/// a new key, `create_revision == 0`); on a conflict the decision is made again. An answer is
/// given only after etcd acknowledged the transaction, that is once a majority of members
/// wrote it to their logs with fsync. Fencing tokens are etcd revisions (see
/// [`Lease::token`] and `docs/etcd.md`): they rise with every acquisition cluster-wide.
///
/// ```no_run
/// use idemstore::{EtcdStore, Fingerprint, Key, Reservation, Reservations};
///
/// # async fn run() -> Result<(), idemstore::Error> {
/// let store = EtcdStore::connect(&["127.0.0.1:2379", "127.0.0.1:22379", "127.0.0.1:32379"]).await?;
/// let key = Key::new("user-1", "POST /charges", "a1")?;
/// if let Reservation::Acquired(lease) = store.reserve(&key, Fingerprint::of(b"amount=100")).await? {
///     store.complete(&lease, b"201 created".to_vec()).await?;
/// }
/// # Ok(()) }
/// ```
///
/// Clones share one connection.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("prefix", &self.inner.layout)
            .field("policies", &self.inner.policies)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects with the default settings; see [`EtcdBuilder::connect`].
    ///
    /// # Errors
    /// [`Error::Cluster`] when no endpoint answers.
    pub async fn connect<E: AsRef<str>>(endpoints: &[E]) -> Result<EtcdStore, Error> {
        EtcdBuilder::default().connect(endpoints).await
    }

    /// Settings to change before connecting.
    pub fn builder() -> EtcdBuilder {
        EtcdBuilder::default()
    }

    pub(crate) fn from_inner(inner: Inner) -> EtcdStore {
        EtcdStore {
            inner: Arc::new(inner),
        }
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    /// How many requests this store (and its clones) sent again because the cluster gave no
    /// definite answer (a member down, a leader election, a timeout). Each was settled by the
    /// resent request's answer, never guessed.
    pub fn resends(&self) -> u64 {
        self.inner
            .resends
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Completes the lease's key and applies the caller's own etcd operations (`ops`) in the
    /// same transaction: both are applied, or neither. The counterpart of
    /// [`Store::complete_with`](crate::Store::complete_with). The operations must not touch
    /// the store's prefix, nor name a key twice.
    ///
    /// ```no_run
    /// use idemstore::etcd_client::TxnOp;
    /// use idemstore::{EtcdStore, Fingerprint, Key, Reservation};
    ///
    /// # async fn run(store: EtcdStore) -> Result<(), idemstore::Error> {
    /// let key = Key::new("user-7", "checkout", "k1")?;
    /// if let Reservation::Acquired(lease) = store.reserve(&key, Fingerprint::of(b"cart")).await? {
    ///     let order = TxnOp::put("orders/1", "1999", None);
    ///     store.complete_with(&lease, b"order 1".to_vec(), vec![order]).await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when the lease no longer owns the key or already completed it
    /// (the operations are not applied); otherwise as for [`complete`](EtcdStore::complete).
    pub async fn complete_with(
        &self,
        lease: &Lease,
        result: Vec<u8>,
        ops: Vec<TxnOp>,
    ) -> Result<(), Error> {
        let op = crate::remote::completion(self.inner(), lease, result)?;
        let reason = match self.inner.apply(&lease.key, op, &ops).await? {
            Ok(Completion::Stored) => return Ok(()),
            // The caller's operations went with the first completion, not this call.
            Ok(Completion::AlreadyCompleted) => LeaseLostReason::Completed {
                by_token: lease.token,
            },
            Err(reason) => reason,
        };
        Err(answer::lease_lost(lease, reason))
    }
}

crate::remote::store_operations!(EtcdStore {
    failure: "Cluster",
    durable: "a majority of the cluster's members wrote it to disk",
    batch: "transactions",
});
