//! [`EtcdBuilder`]: the settings of an [`EtcdStore`], checked when it connects.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use super::hints::Hints;
use super::layout::{Layout, MAX_SLOTS};
use super::store::{EtcdStore, Inner};
use crate::clock::{Clock, SystemClock};
use crate::decide::Policies;
use crate::error::Error;
use crate::record::TokenFloor;
use crate::store::builder::Builder;

/// Largest value this store writes to etcd, under etcd's default `--max-request-bytes`
/// (1.5 MiB) with room for the key and the envelope.
const MAX_ETCD_RESULT_LEN: usize = 1_400 * 1024;

/// Settings for [`EtcdStore::connect`]. Get one from [`EtcdStore::builder`].
#[derive(Clone)]
pub struct EtcdBuilder {
    prefix: Vec<u8>,
    lease: Duration,
    retention: Duration,
    retention_by_operation: Vec<(Vec<u8>, Duration)>,
    max_result_len: usize,
    max_txn_ops: usize,
    op_deadline: Duration,
    request_timeout: Duration,
    clock: Arc<dyn Clock>,
}

impl Default for EtcdBuilder {
    fn default() -> Self {
        EtcdBuilder {
            prefix: Self::DEFAULT_PREFIX.as_bytes().to_vec(),
            lease: Builder::DEFAULT_LEASE,
            retention: Builder::DEFAULT_RETENTION,
            retention_by_operation: Vec::new(),
            max_result_len: Builder::DEFAULT_MAX_RESULT_LEN,
            max_txn_ops: Self::DEFAULT_MAX_TXN_OPS,
            op_deadline: Self::DEFAULT_OP_DEADLINE,
            request_timeout: Self::DEFAULT_REQUEST_TIMEOUT,
            clock: Arc::new(SystemClock),
        }
    }
}

impl EtcdBuilder {
    /// Default etcd key prefix of an [`EtcdStore`].
    pub const DEFAULT_PREFIX: &str = "idemstore/";

    /// Default most operations in one etcd transaction: etcd's own default `--max-txn-ops`.
    pub const DEFAULT_MAX_TXN_OPS: usize = 128;

    /// Default time an operation keeps retrying while the cluster gives no answer (a leader
    /// election takes about one election timeout, 1 s by default).
    pub const DEFAULT_OP_DEADLINE: Duration = Duration::from_secs(10);

    /// Default time one request to a member may take before it is retried.
    pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

    /// The etcd key prefix under which every key of this store lives; stores with different
    /// prefixes share nothing. Default = [`EtcdBuilder::DEFAULT_PREFIX`].
    pub fn prefix(&mut self, prefix: impl AsRef<[u8]>) -> &mut Self {
        self.prefix = prefix.as_ref().to_vec();
        self
    }

    /// How long a completed key is kept, as [`Builder::retention`](crate::Builder::retention).
    /// Every instance sharing a prefix should use the same. Default = 24 h.
    pub fn retention(&mut self, retention: Duration) -> &mut Self {
        self.retention = retention;
        self
    }

    /// How long completed keys of `operation` (the middle part of a [`Key`](crate::Key)) are
    /// kept instead of [`retention`](EtcdBuilder::retention), as
    /// [`Builder::retention_for`](crate::Builder::retention_for): each record carries its own
    /// deadline, written when it is completed, so instances with different settings never
    /// move the deadline of a key another completed. Setting an operation again replaces its
    /// retention. At least 1 ms. Default = none.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use idemstore::EtcdStore;
    ///
    /// # async fn run() -> Result<(), idemstore::Error> {
    /// let store = EtcdStore::builder()
    ///     .retention(Duration::from_secs(24 * 3600))
    ///     .retention_for("POST /charges", Duration::from_secs(7 * 24 * 3600))
    ///     .retention_for("consume", Duration::from_secs(5 * 60))
    ///     .connect(&["127.0.0.1:2379"])
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn retention_for(&mut self, operation: impl AsRef<[u8]>, retention: Duration) -> &mut Self {
        let operation = operation.as_ref().to_vec();
        self.retention_by_operation
            .retain(|(name, _)| *name != operation);
        self.retention_by_operation.push((operation, retention));
        self
    }

    /// How long an acquisition owns a key, as [`Builder::lease`](crate::Builder::lease).
    /// Default = 60 s.
    pub fn lease(&mut self, lease: Duration) -> &mut Self {
        self.lease = lease;
        self
    }

    /// The largest result accepted, in bytes, at most 1,400 KiB (etcd refuses requests over
    /// its `--max-request-bytes`, 1.5 MiB by default). Default = 1 MiB.
    pub fn max_result_len(&mut self, bytes: usize) -> &mut Self {
        self.max_result_len = bytes;
        self
    }

    /// The most operations one transaction may hold: the cluster's `--max-txn-ops`, at least
    /// 8. [`EtcdStore::reserve_many`] packs as many keys as fit. Default =
    /// [`EtcdBuilder::DEFAULT_MAX_TXN_OPS`].
    pub fn max_txn_ops(&mut self, ops: usize) -> &mut Self {
        self.max_txn_ops = ops;
        self
    }

    /// How long an operation keeps retrying while the cluster gives no definite answer (no
    /// leader, a member down) before it returns [`Error::Cluster`]. Default =
    /// [`EtcdBuilder::DEFAULT_OP_DEADLINE`].
    pub fn op_deadline(&mut self, deadline: Duration) -> &mut Self {
        self.op_deadline = deadline;
        self
    }

    /// How long one request may take before it is sent again. Default =
    /// [`EtcdBuilder::DEFAULT_REQUEST_TIMEOUT`].
    pub fn request_timeout(&mut self, timeout: Duration) -> &mut Self {
        self.request_timeout = timeout;
        self
    }

    /// Where leases and retention deadlines get the time. Default = the system clock.
    pub fn clock(&mut self, clock: impl Clock) -> &mut Self {
        self.clock = Arc::new(clock);
        self
    }

    fn check(&self) -> Result<(), Error> {
        let invalid = |setting, reason: &str| {
            Err(crate::OpenError::InvalidConfig {
                setting,
                reason: reason.to_string(),
            }
            .into())
        };
        if self.prefix.is_empty() {
            return invalid("prefix", "it must not be empty");
        }
        if self.lease < Duration::from_millis(1) {
            return invalid("lease", "it must be at least 1 ms");
        }
        if self.retention < Duration::from_millis(1) {
            return invalid("retention", "it must be at least 1 ms");
        }
        crate::store::builder::validate_retentions(&self.retention_by_operation)?;
        if self.max_result_len > MAX_ETCD_RESULT_LEN {
            return invalid(
                "max_result_len",
                &format!(
                    "{} bytes is over {MAX_ETCD_RESULT_LEN}, which etcd's default request limit allows",
                    self.max_result_len
                ),
            );
        }
        if !(8..=MAX_SLOTS).contains(&self.max_txn_ops) {
            return invalid(
                "max_txn_ops",
                &format!("{} is outside 8..={MAX_SLOTS}", self.max_txn_ops),
            );
        }
        if self.op_deadline.is_zero() || self.request_timeout.is_zero() {
            return invalid("op_deadline", "deadlines must be above zero");
        }
        Ok(())
    }

    /// Connects to the cluster at `endpoints` (such as `"127.0.0.1:2379"`). Requests go to any
    /// reachable member; etcd forwards writes to the leader.
    ///
    /// # Errors
    /// [`OpenError::InvalidConfig`](crate::OpenError::InvalidConfig) for a setting out of range; [`Error::Cluster`] when no
    /// endpoint answers.
    pub async fn connect<E: AsRef<str>>(&self, endpoints: &[E]) -> Result<EtcdStore, Error> {
        self.check()?;
        let options = ConnectOptions::new()
            .with_connect_timeout(self.request_timeout)
            .with_timeout(self.request_timeout)
            .with_keep_alive(Duration::from_secs(5), self.request_timeout);
        let client = Client::connect(endpoints, Some(options))
            .await
            .map_err(|source| Error::Cluster {
                context: "connecting to the etcd cluster".to_string(),
                source: Box::new(source),
            })?;
        let store = EtcdStore::from_inner(Inner {
            client,
            layout: Layout::new(&self.prefix),
            // Several processes share one cluster: a lease outlives a process that stopped,
            // since another may still hold keys, so leases keep their times.
            policies: Policies::new(
                self.lease,
                self.retention,
                &self.retention_by_operation,
                TokenFloor::NONE,
            ),
            clock: self.clock.clone(),
            max_result_len: self.max_result_len,
            max_txn_ops: self.max_txn_ops,
            op_deadline: self.op_deadline,
            store_id: random_id(),
            writes: AtomicU64::new(0),
            resends: AtomicU64::new(0),
            hints: Hints::default(),
        });
        // One read (and a write on an empty prefix), so that a wrong address fails here
        // rather than at the first reserve.
        store.inner().check_layout().await?;
        Ok(store)
    }
}

/// A random 64-bit id for this process's store handle: the standard library's randomly keyed
/// hasher, fed the time and the process id.
fn random_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}
