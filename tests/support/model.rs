//! The one reference model of a key's state, shared by the crash model (`crash.rs`) and the
//! `ops` fuzz target (`fuzz/fuzz_targets/ops.rs`, through `tests/support/fuzz/ops.rs`): written
//! from docs/DESIGN.md, not from `decide`, so the store
//! is checked against an independent statement of what it must hold.

use idemstore::whitebox::to_millis;
use idemstore::whitebox::Millis;
use idemstore::LeaseLostReason;
use idemstore::{Fingerprint, Record, Status};

/// The request body `b` (two bodies, so a mismatch can be asked for) as a fingerprint.
pub(crate) fn body(b: u8) -> Fingerprint {
    Fingerprint::of([b % 2])
}

/// The reference model of one key. A token of 0 stands for one never acknowledged (an
/// acquisition whose call failed): any token above those acknowledged before matches it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Model {
    Absent,
    Pending {
        token: u64,
        attempt: u32,
        body: u8,
        lease_until: Millis,
    },
    Completed {
        token: u64,
        attempt: u32,
        body: u8,
        result: Vec<u8>,
        expires_at: Millis,
    },
    Review {
        token: u64,
        attempt: u32,
        body: u8,
        note: String,
    },
}

impl Model {
    /// What callers see at `now`: expired records read as absent.
    pub(crate) fn visible(&self, now: Millis, retention: Millis) -> Model {
        match self {
            Model::Pending { lease_until, .. } if now >= lease_until + retention => Model::Absent,
            Model::Completed { expires_at, .. } if now >= *expires_at => Model::Absent,
            other => other.clone(),
        }
    }

    pub(crate) fn token(&self) -> Option<u64> {
        match self {
            Model::Absent => None,
            Model::Pending { token, .. }
            | Model::Completed { token, .. }
            | Model::Review { token, .. } => Some(*token),
        }
    }

    pub(crate) fn body(&self) -> Option<u8> {
        match self {
            Model::Absent => None,
            Model::Pending { body, .. }
            | Model::Completed { body, .. }
            | Model::Review { body, .. } => Some(*body),
        }
    }

    /// Why a lease with `token` does not own the key.
    pub(crate) fn lost(&self, token: u64) -> Option<LeaseLostReason> {
        match self {
            Model::Absent => Some(LeaseLostReason::Gone),
            Model::Pending { token: t, .. } if *t == token => None,
            Model::Pending { token: t, .. } => Some(LeaseLostReason::TakenOver { by_token: *t }),
            Model::Completed { token: t, .. } => Some(LeaseLostReason::Completed { by_token: *t }),
            Model::Review { .. } => Some(LeaseLostReason::NeedsReview),
        }
    }

    /// Whether the stored `record` (already filtered by expiry) is this state.
    pub(crate) fn matches(&self, record: Option<&Record>, max_token: u64) -> bool {
        let Some(record) = record else {
            return *self == Model::Absent;
        };
        let token_ok = |t: u64| {
            if t == 0 {
                record.token() > max_token
            } else {
                record.token() == t
            }
        };
        let same = |t: u64, a: u32, b: u8| {
            token_ok(t) && record.attempt() == a && record.fingerprint() == body(b)
        };
        match (self, record.status()) {
            (
                Model::Pending {
                    token,
                    attempt,
                    body,
                    lease_until,
                },
                Status::Pending {
                    lease_until: got, ..
                },
            ) => same(*token, *attempt, *body) && to_millis(got) == *lease_until,
            (
                Model::Completed {
                    token,
                    attempt,
                    body,
                    result,
                    ..
                },
                Status::Completed { result: got, .. },
            ) => same(*token, *attempt, *body) && got == result.as_slice(),
            (
                Model::Review {
                    token,
                    attempt,
                    body,
                    note,
                },
                Status::NeedsReview { note: got, .. },
            ) => same(*token, *attempt, *body) && got == note,
            _ => false,
        }
    }

    /// The model state of a recovered record.
    pub(crate) fn of(
        record: Option<&Record>,
        now: Millis,
        candidates: &[Model],
        retention: Millis,
    ) -> Model {
        let Some(record) = record else {
            return Model::Absent;
        };
        let body = (0..2)
            .find(|b| body(*b) == record.fingerprint())
            .expect("the harness uses two bodies");
        let (token, attempt) = (record.token(), record.attempt());
        match record.status() {
            Status::Pending { lease_until, .. } => Model::Pending {
                token,
                attempt,
                body,
                lease_until: to_millis(lease_until),
            },
            Status::Completed { result, .. } => Model::Completed {
                token,
                attempt,
                body,
                result: result.to_vec(),
                expires_at: candidates
                    .iter()
                    .find_map(|c| match c {
                        Model::Completed { expires_at, .. } => Some(*expires_at),
                        _ => None,
                    })
                    .unwrap_or(now + retention),
            },
            Status::NeedsReview { note, .. } => Model::Review {
                token,
                attempt,
                body,
                note: note.to_string(),
            },
            other => panic!("a state the model does not know: {other:?}"),
        }
    }
}
