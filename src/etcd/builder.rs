//! [`EtcdBuilder`]: the settings of an [`EtcdStore`], checked when it connects.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use super::hints::Hints;
use super::layout::{Layout, MAX_SLOTS};
use super::store::{EtcdStore, Inner};
use crate::error::Error;
use crate::remote::settings::{shared_setters, Settings};
use crate::store::builder::Builder;

/// Largest value this store writes to etcd, under etcd's default `--max-request-bytes`
/// (1.5 MiB) with room for the key and the envelope.
const MAX_ETCD_RESULT_LEN: usize = 1_400 * 1024;

/// Settings for [`EtcdStore::connect`]. Get one from [`EtcdStore::builder`].
#[derive(Clone)]
pub struct EtcdBuilder {
    prefix: Vec<u8>,
    shared: Settings,
    max_result_len: usize,
    max_txn_ops: usize,
    op_deadline: Duration,
    request_timeout: Duration,
}

impl Default for EtcdBuilder {
    fn default() -> Self {
        EtcdBuilder {
            prefix: Self::DEFAULT_PREFIX.as_bytes().to_vec(),
            shared: Settings::default(),
            max_result_len: Builder::DEFAULT_MAX_RESULT_LEN,
            max_txn_ops: Self::DEFAULT_MAX_TXN_OPS,
            op_deadline: Self::DEFAULT_OP_DEADLINE,
            request_timeout: Self::DEFAULT_REQUEST_TIMEOUT,
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

    shared_setters!("prefix");

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
        self.shared.check()?;
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
            policies: self.shared.policies(),
            clock: self.shared.clock.clone(),
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
