//! Records: the state stored for each key. The versioned, checksummed binary encoding is in
//! [`codec`]; its layout is documented byte by byte in `docs/format.md`.

pub(crate) mod codec;

use std::time::SystemTime;

use crate::clock::{from_millis, to_millis};
use crate::fingerprint::Fingerprint;

/// Time in milliseconds since the Unix epoch; `u64::MAX` means never.
pub type Millis = u64;

/// A recovery point of multi-step work: "step `step` is done, with this data". Recorded by the
/// lease holder with [`Store::record_step`](crate::Store::record_step); a caller that takes a
/// stale reservation over finds the last one in [`Lease::progress`](crate::Lease::progress) and resumes after it
/// (Stripe's recovery points).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// The last step completed (numbering is the caller's).
    pub step: u32,
    /// What the caller needs to resume after it (an external id, say).
    pub data: Vec<u8>,
}

/// The stored state of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub(crate) fingerprint: Fingerprint,
    /// The fencing token of the acquisition that produced this state.
    pub(crate) token: u64,
    /// How many times the key has been acquired.
    pub(crate) attempt: u32,
    /// When the record stops existing (it then reads as absent, and a sweep deletes it).
    pub(crate) expires_at: Millis,
    pub(crate) state: State,
}

/// The state-specific part of a [`Record`], as stored: times in [`Millis`], owned data.
/// [`Status`] is its public, borrowed view (times as `SystemTime`), and [`RecordClass`] what
/// the state means at a given moment (it tells a live lease from a stale one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    Pending {
        lease_until: Millis,
        progress: Option<Progress>,
    },
    Completed {
        completed_at: Millis,
        result: Vec<u8>,
    },
    NeedsReview {
        since: Millis,
        note: String,
    },
}

/// The first fencing token the store's current owner hands out, fixed when the store is
/// opened. Tokens rise across restarts, so a pending record under a lower token was acquired
/// by an earlier owner of the file: a process that no longer runs (one process owns a store
/// file), whose lease therefore ended with it. [`TokenFloor::NONE`] keeps every lease until
/// its time runs out (the store setting `leases_survive_restart`, and backends shared by
/// several processes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenFloor(pub u64);

impl TokenFloor {
    /// No floor: a lease lasts its time, whoever acquired it.
    pub const NONE: TokenFloor = TokenFloor(0);

    /// Whether a pending record under `token` was acquired by an earlier owner.
    pub(crate) fn orphans(self, token: u64) -> bool {
        token < self.0
    }
}

/// The state a stored record is in at a given moment: the one lease-phase
/// classification that deciding, sweeping, listing stale keys, expiring and the inspection APIs
/// share. Unlike [`Status`], it tells a live reservation from a stale one and counts records
/// past their expiry that a sweep has not deleted yet; [`Status`] carries the state's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum RecordClass {
    /// Reserved, and the lease is live: a worker is doing the work.
    Pending,
    /// Reserved, but the lease ran out without a completion, or the reservation was made by
    /// an earlier owner of the file (leases end with their process, see
    /// [`Builder::leases_survive_restart`](crate::Builder::leases_survive_restart)): the
    /// worker probably died, maybe after side effects. See [`Store::stale`](crate::Store::stale).
    Stale,
    /// Parked for a person by [`Store::mark_needs_review`](crate::Store::mark_needs_review).
    NeedsReview,
    /// Done; the result is replayed to duplicates.
    Completed,
    /// Past its expiry: it already reads as absent, and [`Store::sweep`](crate::Store::sweep) will delete it.
    Expired,
}

impl RecordClass {
    /// Every class, in the order tools print them.
    pub const ALL: [RecordClass; 5] = [
        RecordClass::Pending,
        RecordClass::Stale,
        RecordClass::NeedsReview,
        RecordClass::Completed,
        RecordClass::Expired,
    ];

    /// A short lowercase name: `pending`, `stale`, `needs-review`, `completed` or `expired`.
    pub fn name(self) -> &'static str {
        match self {
            RecordClass::Pending => "pending",
            RecordClass::Stale => "stale",
            RecordClass::NeedsReview => "needs-review",
            RecordClass::Completed => "completed",
            RecordClass::Expired => "expired",
        }
    }
}

impl std::fmt::Display for RecordClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A read-only view of a record's state, from [`Record::status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status<'a> {
    /// Reserved; the lease holder is doing the work.
    Pending {
        /// When the lease runs out and the key becomes stale.
        lease_until: SystemTime,
        /// The last recovery point recorded with
        /// [`Store::record_step`](crate::Store::record_step).
        progress: Option<&'a Progress>,
    },
    /// Done; the result is replayed to duplicates.
    Completed {
        /// The stored result.
        result: &'a [u8],
        /// When it was completed.
        completed_at: SystemTime,
    },
    /// Parked for a person; duplicates are refused until it is resolved.
    NeedsReview {
        /// The note left by [`Store::mark_needs_review`](crate::Store::mark_needs_review).
        note: &'a str,
        /// When it was marked.
        since: SystemTime,
    },
}

impl Record {
    /// A record from its parts, as [`Record`]'s accessors show them: for restoring records
    /// read from an export ([`import`](crate::import)). `expires_at` is `None` only for a key
    /// under review (which never expires); times count in whole milliseconds since the Unix
    /// epoch, as stored (finer parts are dropped).
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use idemstore::{Fingerprint, Record, Status};
    ///
    /// let at = UNIX_EPOCH + Duration::from_millis(1_800_000_000_000);
    /// let status = Status::Completed { result: b"201 created", completed_at: at };
    /// let record = Record::new(Fingerprint::of(b"body"), 7, 1, Some(at + Duration::from_secs(86_400)), status);
    /// assert_eq!(record.token(), 7);
    /// assert_eq!(record.status(), status);
    /// ```
    pub fn new(
        fingerprint: Fingerprint,
        token: u64,
        attempt: u32,
        expires_at: Option<SystemTime>,
        status: Status<'_>,
    ) -> Record {
        let state = match status {
            Status::Pending {
                lease_until,
                progress,
            } => State::Pending {
                lease_until: to_millis(lease_until),
                progress: progress.cloned(),
            },
            Status::Completed {
                result,
                completed_at,
            } => State::Completed {
                completed_at: to_millis(completed_at),
                result: result.to_vec(),
            },
            Status::NeedsReview { note, since } => State::NeedsReview {
                since: to_millis(since),
                note: note.to_string(),
            },
        };
        Record {
            fingerprint,
            token,
            attempt,
            expires_at: expires_at.map_or(Millis::MAX, to_millis),
            state,
        }
    }

    /// The fingerprint of the request that first reserved the key.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The fencing token of the latest acquisition.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// How many times the key has been acquired (1 for a first attempt).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When the record expires: for a completed key, the end of its retention; for a pending
    /// key, the end of its lease plus the retention (an abandoned reservation). `None` for a
    /// key under review, which never expires.
    pub fn expires_at(&self) -> Option<SystemTime> {
        (self.expires_at != Millis::MAX).then(|| from_millis(self.expires_at))
    }

    /// The state-specific part.
    pub fn status(&self) -> Status<'_> {
        match &self.state {
            State::Pending {
                lease_until,
                progress,
            } => Status::Pending {
                lease_until: from_millis(*lease_until),
                progress: progress.as_ref(),
            },
            State::Completed {
                completed_at,
                result,
            } => Status::Completed {
                result,
                completed_at: from_millis(*completed_at),
            },
            State::NeedsReview { since, note } => Status::NeedsReview {
                note,
                since: from_millis(*since),
            },
        }
    }

    /// Whether the record reads as absent at `now`.
    pub(crate) fn is_expired(&self, now: Millis) -> bool {
        now >= self.expires_at
    }

    /// The class of the record at `now` under the owner's `floor`, with the same rules as
    /// [`reserve`](crate::Store::reserve): a lease is live while `now < lease_until` and its
    /// token is not below the floor (an earlier owner's lease ended with it); a record reads
    /// as absent from `expires_at` on.
    pub(crate) fn class(&self, now: Millis, floor: TokenFloor) -> RecordClass {
        if self.is_expired(now) {
            return RecordClass::Expired;
        }
        match self.state {
            State::Pending { lease_until, .. }
                if now < lease_until && !floor.orphans(self.token) =>
            {
                RecordClass::Pending
            }
            State::Pending { .. } => RecordClass::Stale,
            State::Completed { .. } => RecordClass::Completed,
            State::NeedsReview { .. } => RecordClass::NeedsReview,
        }
    }

    /// The lease deadline, for a pending record.
    pub(crate) fn lease_until(&self) -> Option<Millis> {
        match self.state {
            State::Pending { lease_until, .. } => Some(lease_until),
            _ => None,
        }
    }
}
