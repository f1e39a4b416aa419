//! The clock: the manual clock tests run on, the conversions to milliseconds and the times
//! reports print.

use std::time::{Duration, UNIX_EPOCH};

use idemstore::whitebox::{describe_millis, duration_millis, from_millis, to_millis};
use idemstore::{Clock, ManualClock};

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

#[test]
fn times_in_reports_are_rfc3339_utc() {
    assert_eq!(describe_millis(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(describe_millis(951_782_400_250), "2000-02-29T00:00:00.250Z");
    assert_eq!(
        describe_millis(1_795_000_000_000),
        "2026-11-18T11:06:40.000Z"
    );
}
