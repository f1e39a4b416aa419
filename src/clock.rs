//! Time: the [`Clock`] trait, the system clock and a manual clock for tests.
//!
//! The engine never reads the system time directly; every decision takes "now" from the clock
//! the store was built with. Internally time is whole milliseconds since the Unix epoch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time.
///
/// Implement it to drive a store from your own time source; use [`ManualClock`] in tests.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// The operating system's wall clock. The default.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to. Clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use idemstore::ManualClock;
///
/// let clock = ManualClock::new();
/// let start = clock.time();
/// clock.advance(Duration::from_secs(90));
/// assert_eq!(clock.time(), start + Duration::from_secs(90));
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    millis: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock that starts at the current system time, rounded down to a millisecond.
    pub fn new() -> ManualClock {
        ManualClock::starting_at(SystemTime::now())
    }

    /// A clock that starts at `time` (rounded down to a millisecond; before 1970 counts as 1970).
    pub fn starting_at(time: SystemTime) -> ManualClock {
        ManualClock {
            millis: Arc::new(AtomicU64::new(to_millis(time))),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.millis.fetch_add(duration_millis(by), Ordering::SeqCst);
    }

    /// Sets the clock to `time`, forwards or backwards.
    pub fn set(&self, time: SystemTime) {
        self.millis.store(to_millis(time), Ordering::SeqCst);
    }

    /// The clock's current time.
    pub fn time(&self) -> SystemTime {
        from_millis(self.millis.load(Ordering::SeqCst))
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        self.time()
    }
}

/// Milliseconds since the Unix epoch; times before it count as 0, times past `u64` saturate.
pub(crate) fn to_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(duration_millis)
        .unwrap_or(0)
}

/// The time `millis` milliseconds after the Unix epoch.
pub(crate) fn from_millis(millis: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(millis)
}

/// A duration in whole milliseconds, saturating at `u64::MAX`.
pub(crate) fn duration_millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::starting_at(from_millis(1_000));
        let copy = clock.clone();
        assert_eq!(to_millis(clock.now()), 1_000);
        copy.advance(Duration::from_millis(250));
        assert_eq!(to_millis(clock.now()), 1_250);
        clock.set(from_millis(10));
        assert_eq!(to_millis(copy.now()), 10);
    }

    #[test]
    fn conversions_saturate() {
        assert_eq!(to_millis(UNIX_EPOCH - Duration::from_secs(5)), 0);
        assert_eq!(duration_millis(Duration::MAX), u64::MAX);
    }
}
