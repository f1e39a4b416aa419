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
pub fn to_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(duration_millis)
        .unwrap_or(0)
}

/// The time `millis` milliseconds after the Unix epoch.
pub fn from_millis(millis: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(millis)
}

/// A duration in whole milliseconds, saturating at `u64::MAX`.
pub fn duration_millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A time in a problem report, in UTC as RFC 3339 (`2026-11-29T12:00:00.250Z`).
pub fn describe_millis(millis: u64) -> String {
    if millis == u64::MAX {
        return "never".into();
    }
    let (days, ms) = (millis / 86_400_000, millis % 86_400_000);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's days_from_civil, inverted).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1_000 % 60,
        ms % 1_000
    )
}
