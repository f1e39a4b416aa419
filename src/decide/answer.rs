//! The mapping from a decision's outcome to the answer a caller gets back, the same for
//! every backend (the local [`Store`](crate::Store), the etcd and PostgreSQL stores). Each
//! function takes one operation's own outcome type, so every mapping is total.

use super::{Completion, LeaseOutcome, Reserved};
use crate::answers::{Completed, Lease, Reservation, Seen};
use crate::clock::from_millis;
use crate::decide::expire::Expired;
use crate::error::{Error, LeaseLostReason};
use crate::key::Key;
use crate::record::RecordClass;

/// A reserve's answer for `key`.
pub(crate) fn reservation(key: &Key, reserved: Reserved) -> Reservation {
    match reserved {
        Reserved::Acquired {
            token,
            attempt,
            lease_until,
            progress,
        } => Reservation::Acquired(Lease {
            key: key.clone(),
            token,
            attempt,
            lease_until: from_millis(lease_until),
            progress,
        }),
        Reserved::Completed {
            result,
            completed_at,
            expires_at,
            attempt,
        } => Reservation::Completed(Completed {
            result,
            completed_at: from_millis(completed_at),
            expires_at: from_millis(expires_at),
            attempt,
        }),
        Reserved::InProgress {
            retry_after,
            attempt,
        } => Reservation::InProgress {
            retry_after,
            attempt,
        },
        Reserved::Mismatch => Reservation::Mismatch,
        Reserved::NeedsReview { note } => Reservation::NeedsReview { note },
    }
}

/// [`Error::LeaseLost`] for `lease`.
pub(crate) fn lease_lost(lease: &Lease, reason: LeaseLostReason) -> Error {
    Error::LeaseLost {
        key: lease.key.clone(),
        token: lease.token,
        reason,
    }
}

/// The answer of an operation that names `lease`: its value, or why the lease is lost.
pub(crate) fn with_lease<T>(lease: &Lease, outcome: LeaseOutcome<T>) -> Result<T, Error> {
    outcome.map_err(|reason| lease_lost(lease, reason))
}

/// A completion's answer: completing again with the same lease keeps the first result and
/// succeeds, so a caller that saw an error after its completion may have landed can retry.
pub(crate) fn completion(lease: &Lease, outcome: LeaseOutcome<Completion>) -> Result<(), Error> {
    with_lease(lease, outcome).map(|_| ())
}

/// A resolve's answer for `key`.
pub(crate) fn resolved(key: &Key, outcome: Result<(), &'static str>) -> Result<(), Error> {
    outcome.map_err(|reason| Error::NotResolvable {
        key: key.clone(),
        reason,
    })
}

/// An observe's answer.
pub(crate) fn seen(new: bool) -> Seen {
    if new {
        Seen::New
    } else {
        Seen::Duplicate
    }
}

/// An expire's answer for `key`: the class of the removed record, `None` when nothing was
/// stored.
pub(crate) fn expired(key: &Key, outcome: Expired) -> Result<Option<RecordClass>, Error> {
    match outcome {
        Ok(class) => Ok(class),
        Err(lease_until) => Err(Error::LeaseLive {
            key: key.clone(),
            lease_until: from_millis(lease_until),
        }),
    }
}
