//! Store configuration: [`Builder`] and [`Durability`]. Every default lives here.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{duration_millis, Clock, SystemClock};
use crate::error::Error;
use crate::store::Store;

/// Default for [`Builder::retention`]: 24 hours, as long as Stripe keeps keys.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
/// Default for [`Builder::lease`]: 60 seconds.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// Default for [`Builder::max_result_len`]: 1 MiB.
pub const DEFAULT_MAX_RESULT_LEN: usize = 1 << 20;
/// The largest value [`Builder::max_result_len`] accepts: 256 MiB.
pub const MAX_RESULT_LEN_LIMIT: usize = 256 << 20;
/// Default for [`Builder::cache_size`]: 64 MiB.
pub const DEFAULT_CACHE_SIZE: usize = 64 << 20;

/// When an operation counts as done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// Every acknowledged reservation, completion and release is on disk (fsync'd) before the
    /// call returns; concurrent callers share one fsync.
    ///
    /// Survives a process crash: yes. Survives a power loss: yes.
    #[default]
    Immediate,
}

/// Configures and opens a [`Store`].
///
/// ```
/// use std::time::Duration;
/// use idemstore::Store;
///
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("keys.idem");
/// let store = Store::builder()
///     .retention(Duration::from_secs(6 * 3600))
///     .lease(Duration::from_secs(30))
///     .max_result_len(64 * 1024)
///     .open(&path)?;
/// # drop(store);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Builder {
    pub(crate) retention: Duration,
    pub(crate) lease: Duration,
    pub(crate) durability: Durability,
    pub(crate) max_result_len: usize,
    pub(crate) cache_size: usize,
    pub(crate) clock: Arc<dyn Clock>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            retention: DEFAULT_RETENTION,
            lease: DEFAULT_LEASE,
            durability: Durability::default(),
            max_result_len: DEFAULT_MAX_RESULT_LEN,
            cache_size: DEFAULT_CACHE_SIZE,
            clock: Arc::new(SystemClock),
        }
    }
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("retention", &self.retention)
            .field("lease", &self.lease)
            .field("durability", &self.durability)
            .field("max_result_len", &self.max_result_len)
            .field("cache_size", &self.cache_size)
            .finish_non_exhaustive()
    }
}

impl Builder {
    /// A builder with every default.
    pub fn new() -> Builder {
        Builder::default()
    }

    /// How long a completed key is kept and its result replayed; afterwards the key reads as
    /// absent and the next request acquires it afresh. Also how long an abandoned reservation
    /// is kept after its lease ran out. At least 1 ms. Default = [`DEFAULT_RETENTION`] (24 h).
    pub fn retention(&mut self, retention: Duration) -> &mut Self {
        self.retention = retention;
        self
    }

    /// How long an acquisition owns a key before it goes stale and the next reserve may take it
    /// over. Extend it with [`Store::extend`] for long work. At least 1 ms.
    /// Default = [`DEFAULT_LEASE`] (60 s).
    pub fn lease(&mut self, lease: Duration) -> &mut Self {
        self.lease = lease;
        self
    }

    /// When operations count as done. Default = [`Durability::Immediate`].
    pub fn durability(&mut self, durability: Durability) -> &mut Self {
        self.durability = durability;
        self
    }

    /// The largest result [`Store::complete`] accepts, in bytes, up to
    /// [`MAX_RESULT_LEN_LIMIT`]. Default = [`DEFAULT_MAX_RESULT_LEN`] (1 MiB).
    pub fn max_result_len(&mut self, bytes: usize) -> &mut Self {
        self.max_result_len = bytes;
        self
    }

    /// Memory redb may use to cache pages of the file. Default = [`DEFAULT_CACHE_SIZE`] (64 MiB).
    pub fn cache_size(&mut self, bytes: usize) -> &mut Self {
        self.cache_size = bytes;
        self
    }

    /// The time source. Default = [`SystemClock`]; use [`ManualClock`](crate::ManualClock) in tests.
    pub fn clock(&mut self, clock: impl Clock) -> &mut Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Opens the store at `path`, creating it (crash-safely) if it does not exist.
    ///
    /// # Errors
    /// - [`Error::InvalidConfig`] for a setting out of range;
    /// - [`Error::NotAStore`] when `path` is a directory or another program's file (which is
    ///   left untouched);
    /// - [`Error::AlreadyOpen`] when another process or `Store` has it open;
    /// - [`Error::Io`], [`Error::Storage`] or [`Error::Corruption`] when the file cannot be read.
    pub fn open(&self, path: impl AsRef<Path>) -> Result<Store, Error> {
        self.validate()?;
        Store::open_with(self, path.as_ref())
    }

    fn validate(&self) -> Result<(), Error> {
        let check = |ok: bool, setting: &'static str, reason: &str| {
            if ok {
                Ok(())
            } else {
                Err(Error::InvalidConfig {
                    setting,
                    reason: reason.to_string(),
                })
            }
        };
        check(
            duration_millis(self.lease) >= 1,
            "lease",
            "must be at least 1 ms",
        )?;
        check(
            duration_millis(self.retention) >= 1,
            "retention",
            "must be at least 1 ms",
        )?;
        check(
            self.max_result_len <= MAX_RESULT_LEN_LIMIT,
            "max_result_len",
            &format!(
                "{} bytes is above the limit of {MAX_RESULT_LEN_LIMIT} bytes",
                self.max_result_len
            ),
        )
    }
}
