//! The guard's counters, reported to the `metrics` facade with the `metrics` feature; the
//! names are listed in the [module docs](crate::guard#metrics).

/// One thing the guard counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    Replay,
    Wait,
    InProgress,
    Mismatch,
    ReleasedNotStored,
    ReleasedFailed,
    NotStored,
}

/// Counts `event` (a no-op without the `metrics` feature).
pub(crate) fn count(event: Event) {
    #[cfg(feature = "metrics")]
    {
        let counter = match event {
            Event::Replay => metrics::counter!("idemstore_guard_replays_total"),
            Event::Wait => metrics::counter!("idemstore_guard_waits_total"),
            Event::InProgress => metrics::counter!("idemstore_guard_in_progress_total"),
            Event::Mismatch => metrics::counter!("idemstore_guard_mismatches_total"),
            Event::ReleasedNotStored => {
                metrics::counter!("idemstore_guard_released_total", "reason" => "not_stored")
            }
            Event::ReleasedFailed => {
                metrics::counter!("idemstore_guard_released_total", "reason" => "failed")
            }
            Event::NotStored => metrics::counter!("idemstore_guard_not_stored_total"),
        };
        counter.increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = event;
}
