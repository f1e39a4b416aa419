//! The settings every cluster-backed store shares (lease, retentions, the clock), their
//! checks, and [`shared_setters!`], which gives a builder their documented setters.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::decide::Policies;
use crate::error::OpenError;
use crate::record::TokenFloor;
use crate::store::builder::{validate_retentions, Builder};

/// What an [`EtcdBuilder`](crate::EtcdBuilder) and a [`PgBuilder`](crate::PgBuilder) both set.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
    pub(crate) retention_by_operation: Vec<(Vec<u8>, Duration)>,
    pub(crate) clock: Arc<dyn Clock>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            lease: Builder::DEFAULT_LEASE,
            retention: Builder::DEFAULT_RETENTION,
            retention_by_operation: Vec::new(),
            clock: Arc::new(SystemClock),
        }
    }
}

impl Settings {
    /// Sets `operation`'s retention, replacing an earlier one.
    pub(crate) fn retention_for(&mut self, operation: &[u8], retention: Duration) {
        self.retention_by_operation
            .retain(|(name, _)| name != operation);
        self.retention_by_operation
            .push((operation.to_vec(), retention));
    }

    /// Refuses a lease or a retention under 1 ms, naming the setting.
    pub(crate) fn check(&self) -> Result<(), OpenError> {
        for (setting, value) in [("lease", self.lease), ("retention", self.retention)] {
            if value < Duration::from_millis(1) {
                return Err(OpenError::InvalidConfig {
                    setting,
                    reason: "it must be at least 1 ms".to_string(),
                });
            }
        }
        validate_retentions(&self.retention_by_operation)
    }

    /// The policies of a store shared by several processes: a lease outlives a process that
    /// stopped, since another may still hold keys, so leases keep their times.
    pub(crate) fn policies(&self) -> Policies {
        Policies::new(
            self.lease,
            self.retention,
            &self.retention_by_operation,
            TokenFloor::NONE,
        )
    }
}

/// The setters of [`Settings`] for a builder with a `shared: Settings` field; `$shared` names
/// what instances share (`"prefix"`, `"table"`).
macro_rules! shared_setters {
    ($shared:literal) => {
        /// How long a completed key is kept, as [`Builder::retention`](crate::Builder::retention).
        #[doc = concat!("Every instance sharing a ", $shared, " should use the same. Default = 24 h.")]
        pub fn retention(&mut self, retention: std::time::Duration) -> &mut Self {
            self.shared.retention = retention;
            self
        }

        /// How long completed keys of `operation` (the middle part of a
        /// [`Key`](crate::Key)) are kept instead of the store's retention, as
        /// [`Builder::retention_for`](crate::Builder::retention_for): each record carries its
        /// own deadline, written when it is completed, so instances with different settings
        /// never move the deadline of a key another completed. Setting an operation again
        /// replaces its retention. At least 1 ms. Default = none.
        pub fn retention_for(
            &mut self,
            operation: impl AsRef<[u8]>,
            retention: std::time::Duration,
        ) -> &mut Self {
            self.shared.retention_for(operation.as_ref(), retention);
            self
        }

        /// How long an acquisition owns a key, as [`Builder::lease`](crate::Builder::lease).
        /// Default = 60 s.
        pub fn lease(&mut self, lease: std::time::Duration) -> &mut Self {
            self.shared.lease = lease;
            self
        }

        /// Where leases and retention deadlines get the time. Default = the system clock.
        /// Every instance's clock should agree within a small part of the lease (NTP).
        pub fn clock(&mut self, clock: impl crate::clock::Clock) -> &mut Self {
            self.shared.clock = std::sync::Arc::new(clock);
            self
        }
    };
}

pub(crate) use shared_setters;
