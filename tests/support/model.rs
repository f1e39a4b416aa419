//! The one reference model of a key's state, shared by the crash model (`crash.rs`), the
//! `ops` fuzz target (`fuzz/fuzz_targets/ops.rs`, through `tests/support/fuzz/ops.rs`) and the
//! model-based property test (`model.rs`, through [`Keys`], the model of a whole store):
//! written from docs/DESIGN.md, not from `decide`, so the store is checked against an
//! independent statement of what it must hold.

use std::collections::HashMap;

use idemstore::whitebox::to_millis;
use idemstore::whitebox::Millis;
use idemstore::LeaseLostReason;
use idemstore::{Fingerprint, Record, RecordClass, Status};

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
        completed_at: Millis,
        expires_at: Millis,
    },
    Review {
        token: u64,
        attempt: u32,
        body: u8,
        note: String,
        since: Millis,
    },
}

impl Model {
    /// What callers see at `now`: expired records read as absent.
    pub(crate) fn visible(&self, now: Millis, retention: Millis) -> Model {
        match self.expires_at(retention) {
            Some(expires_at) if now >= expires_at => Model::Absent,
            _ => self.clone(),
        }
    }

    /// When the record expires: a pending one `retention` after its lease ends, a completed
    /// one at its deadline, one needing review never.
    pub(crate) fn expires_at(&self, retention: Millis) -> Option<Millis> {
        match self {
            Model::Absent | Model::Review { .. } => None,
            Model::Pending { lease_until, .. } => Some(lease_until + retention),
            Model::Completed { expires_at, .. } => Some(*expires_at),
        }
    }

    /// Whether this is a pending record whose lease is live at `now`: not past its end, and
    /// granted by this store (`token >= floor`: leases end with the store that granted them).
    pub(crate) fn lease_live(&self, now: Millis, floor: u64) -> bool {
        matches!(self, Model::Pending { token, lease_until, .. }
            if now < *lease_until && *token >= floor)
    }

    pub(crate) fn token(&self) -> Option<u64> {
        match self {
            Model::Absent => None,
            Model::Pending { token, .. }
            | Model::Completed { token, .. }
            | Model::Review { token, .. } => Some(*token),
        }
    }

    pub(crate) fn attempt(&self) -> Option<u32> {
        match self {
            Model::Absent => None,
            Model::Pending { attempt, .. }
            | Model::Completed { attempt, .. }
            | Model::Review { attempt, .. } => Some(*attempt),
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
                    ..
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
            Status::Completed {
                result,
                completed_at,
            } => Model::Completed {
                token,
                attempt,
                body,
                result: result.to_vec(),
                completed_at: to_millis(completed_at),
                expires_at: candidates
                    .iter()
                    .find_map(|c| match c {
                        Model::Completed { expires_at, .. } => Some(*expires_at),
                        _ => None,
                    })
                    .unwrap_or(now + retention),
            },
            Status::NeedsReview { note, since } => Model::Review {
                token,
                attempt,
                body,
                note: note.to_string(),
                since: to_millis(since),
            },
            other => panic!("a state the model does not know: {other:?}"),
        }
    }
}

/// What `reserve` answers, per docs/DESIGN.md, in plain fields (times in milliseconds).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    Acquired {
        attempt: u32,
    },
    Completed {
        result: Vec<u8>,
        completed_at: Millis,
        expires_at: Millis,
        attempt: u32,
    },
    InProgress {
        retry_after_ms: Millis,
        attempt: u32,
    },
    Mismatch,
    NeedsReview {
        note: String,
    },
}

/// The reference model of a whole store: each key's [`Model`], the time, the largest token
/// handed out (the store picks tokens; the model checks that each is bigger than all before)
/// and the token floor of the last reopen. Keys are small indexes; `retention` gives each
/// key's retention (per its operation), `lease` the store's lease.
#[derive(Clone)]
pub(crate) struct Keys {
    pub(crate) now: Millis,
    pub(crate) records: HashMap<usize, Model>,
    pub(crate) max_token: u64,
    /// Tokens below this one were handed out before the last reopen: leases end with the
    /// store that granted them, so those reservations are stale whatever their lease time.
    pub(crate) floor: u64,
    pub(crate) lease: Millis,
    pub(crate) retention: fn(usize) -> Millis,
}

impl Keys {
    pub(crate) fn new(now: Millis, lease: Millis, retention: fn(usize) -> Millis) -> Keys {
        Keys {
            now,
            records: HashMap::new(),
            max_token: 0,
            floor: 0,
            lease,
            retention,
        }
    }

    /// The record of `key` unless it has expired: an expired record reads as absent.
    pub(crate) fn live(&self, key: usize) -> Option<&Model> {
        self.records
            .get(&key)
            .filter(|r| r.visible(self.now, (self.retention)(key)) != Model::Absent)
    }

    /// When `key`'s stored record expires (`None`: never), expired or not.
    pub(crate) fn expires_at(&self, key: usize) -> Option<Millis> {
        self.records[&key].expires_at((self.retention)(key))
    }

    /// Whether `token` owns `key` (it is pending under that token), else why not.
    pub(crate) fn owner_check(&self, key: usize, token: u64) -> Result<(), LeaseLostReason> {
        match self.live(key).unwrap_or(&Model::Absent).lost(token) {
            None => Ok(()),
            Some(reason) => Err(reason),
        }
    }

    /// What `reserve` of `key` with request body `body` answers now.
    pub(crate) fn reserve(&self, key: usize, body: u8) -> Answer {
        let Some(r) = self.live(key) else {
            return Answer::Acquired { attempt: 1 };
        };
        if r.body() != Some(body) {
            return Answer::Mismatch;
        }
        match r {
            Model::Absent => unreachable!("live records are stored"),
            Model::Completed {
                result,
                completed_at,
                expires_at,
                attempt,
                ..
            } => Answer::Completed {
                result: result.clone(),
                completed_at: *completed_at,
                expires_at: *expires_at,
                attempt: *attempt,
            },
            Model::Pending {
                lease_until,
                attempt,
                ..
            } if r.lease_live(self.now, self.floor) => Answer::InProgress {
                retry_after_ms: lease_until - self.now,
                attempt: *attempt,
            },
            Model::Pending { attempt, .. } => Answer::Acquired {
                attempt: attempt + 1,
            },
            Model::Review { note, .. } => Answer::NeedsReview { note: note.clone() },
        }
    }

    /// `key` now pending under a new lease.
    pub(crate) fn pending(&mut self, key: usize, body: u8, token: u64, attempt: u32) {
        let lease_until = self.now + self.lease;
        let record = Model::Pending {
            token,
            attempt,
            body,
            lease_until,
        };
        self.records.insert(key, record);
    }

    /// `key`'s lease extended by a whole lease from now.
    pub(crate) fn extend(&mut self, key: usize) {
        let now = self.now + self.lease;
        if let Some(Model::Pending { lease_until, .. }) = self.records.get_mut(&key) {
            *lease_until = now;
        }
    }

    /// `key` completed with `result`, kept for `retention` (its operation's by default).
    pub(crate) fn complete(&mut self, key: usize, result: Vec<u8>, retention: Option<Millis>) {
        let now = self.now;
        let retention = retention.unwrap_or((self.retention)(key));
        let record = self.records.get_mut(&key).expect("completing a stored key");
        let (token, attempt, body) = (
            record.token().unwrap(),
            record.attempt().unwrap(),
            record.body().unwrap(),
        );
        *record = Model::Completed {
            token,
            attempt,
            body,
            result,
            completed_at: now,
            expires_at: now + retention,
        };
    }

    /// `key` marked for review with `note`: kept until resolved.
    pub(crate) fn review(&mut self, key: usize, note: String) {
        let now = self.now;
        let record = self.records.get_mut(&key).expect("marking a stored key");
        *record = Model::Review {
            token: record.token().unwrap(),
            attempt: record.attempt().unwrap(),
            body: record.body().unwrap(),
            note,
            since: now,
        };
    }

    /// What expiring `key` answers, and its effect: whatever is stored goes, also past its
    /// expiry (the bytes must go), except under a live lease unless forced, which answers the
    /// lease's end.
    pub(crate) fn expire(
        &mut self,
        key: usize,
        force: bool,
    ) -> Result<Option<RecordClass>, Millis> {
        let Some(record) = self.records.get(&key) else {
            return Ok(None);
        };
        let class = if self.live(key).is_none() {
            RecordClass::Expired
        } else {
            match record {
                Model::Absent => unreachable!("stored records are not absent"),
                Model::Pending { lease_until, .. } if record.lease_live(self.now, self.floor) => {
                    if !force {
                        return Err(*lease_until);
                    }
                    RecordClass::Pending
                }
                Model::Pending { .. } => RecordClass::Stale,
                Model::Completed { .. } => RecordClass::Completed,
                Model::Review { .. } => RecordClass::NeedsReview,
            }
        };
        self.records.remove(&key);
        Ok(Some(class))
    }

    /// What deleting the ended expiry windows removes: every stored record whose window
    /// ([`window_end`]) ended at the store's time, expired with it.
    pub(crate) fn drop_ended_windows(&mut self) -> Vec<(usize, Model)> {
        let now = self.now;
        let ended: Vec<usize> = self
            .records
            .keys()
            .copied()
            .filter(|&k| {
                let written = match &self.records[&k] {
                    Model::Pending { lease_until, .. } => *lease_until,
                    Model::Completed { completed_at, .. } => *completed_at,
                    Model::Absent | Model::Review { .. } => return false,
                };
                self.expires_at(k)
                    .is_some_and(|t| window_end(t, written) <= now)
            })
            .collect();
        ended
            .into_iter()
            .map(|k| (k, self.records.remove(&k).expect("a stored record")))
            .collect()
    }

    /// Whether `key` is pending and stale at `now` (its lease ended or granted by an earlier
    /// store) but not expired: what `stale` lists, by its lease's end.
    pub(crate) fn stale_since(&self, key: usize) -> Option<Millis> {
        match self.live(key)? {
            Model::Pending {
                token, lease_until, ..
            } if *lease_until <= self.now || *token < self.floor => Some(*lease_until),
            _ => None,
        }
    }
}

/// When the expiry window of a record that expires at `t` and was written at `written` ends
/// (docs/format.md, "Windows"): its window is the span of the largest power of two
/// milliseconds at most a 16th of its horizon (`t - written`, at least 1 ms) that holds `t`,
/// as long as the store keeps fewer than 48 windows (this model's stores keep far fewer).
pub(crate) fn window_end(t: Millis, written: Millis) -> Millis {
    let level = (t.saturating_sub(written) / 16).max(1).ilog2();
    ((t >> level) + 1) << level
}
