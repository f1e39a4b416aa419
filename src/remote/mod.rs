//! What the cluster-backed stores share: the public operations of
//! [`EtcdStore`](crate::EtcdStore) and [`PgStore`](crate::PgStore), written once over a
//! [`Backend`] that each implements with only its dialect (how a key is read, and how a
//! decision is written under a compare and settled when its answer was lost).
//!
//! Each operation builds its [`decide`](crate::decide) operation, checks the caller's input,
//! has the backend decide and write it, and maps the outcome to the public answer
//! ([`answer`]), as the local [`Store`](crate::Store) does. [`store_operations!`] gives each
//! store these functions as its own documented methods.

mod methods;
pub(crate) mod settings;
pub(crate) mod snapshot;

use std::future::Future;
use std::time::Duration;

pub(crate) use methods::store_operations;

use crate::answers::{Lease, LiveLease, Reservation, Seen};
use crate::clock::{duration_millis, from_millis};
use crate::decide::answer;
use crate::decide::Expire;
use crate::decide::{
    Complete, Extend, LeaseOutcome, MarkNeedsReview, Observe, Operation, RecordStep, Release,
    Reserve, Reserved, Resolution, Resolve, WithRetention,
};
use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::record::{Millis, Progress, Record, RecordClass};

/// A place to keep reservations remotely: the dialect each cluster store speaks.
pub(crate) trait Backend: Send + Sync {
    /// The store's clock, in milliseconds.
    fn now(&self) -> Millis;

    /// The longest result (or step data) the store accepts.
    fn max_result_len(&self) -> usize;

    /// Decides `op` on `key`'s record and writes the change under a compare on the record it
    /// was decided on, deciding again when the record changed; `absent_first`: the key is
    /// guessed absent before it is read (a reserve or an observe of a key that is mostly new).
    fn decide_write<O>(
        &self,
        key: &Key,
        op: O,
        absent_first: bool,
    ) -> impl Future<Output = Result<O::Outcome, Error>> + Send
    where
        O: Operation + Clone + Sync;

    /// [`decide_write`](Backend::decide_write) for many keys in few round trips; one answer
    /// per item, in order. A key named twice is decided again after its first occurrence
    /// was written.
    fn decide_write_many<O>(
        &self,
        items: &[(Key, O)],
        absent_first: bool,
    ) -> impl Future<Output = Result<Vec<Result<O::Outcome, Error>>, Error>> + Send
    where
        O: Operation + Clone + Sync;

    /// `key`'s record as stored, expired or not.
    fn read_record(&self, key: &Key) -> impl Future<Output = Result<Option<Record>, Error>> + Send;

    /// A reserve's outcome as it is answered (etcd renews a lease that landed late).
    fn acquired(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        reserved: Reserved,
    ) -> impl Future<Output = Result<Reserved, Error>> + Send {
        let _ = (key, fingerprint);
        async move { Ok(reserved) }
    }
}

/// [`Error::ResultTooLarge`] when `result` is over the store's limit.
pub(crate) fn check_result<B: Backend>(b: &B, key: &Key, result: &[u8]) -> Result<(), Error> {
    let limit = b.max_result_len();
    if result.len() > limit {
        return Err(Error::ResultTooLarge {
            key: key.clone(),
            len: result.len(),
            limit,
        });
    }
    Ok(())
}

pub(crate) async fn reserve<B: Backend>(
    b: &B,
    key: &Key,
    fingerprint: Fingerprint,
) -> Result<Reservation, Error> {
    let reserved = b.decide_write(key, Reserve { fingerprint }, true).await?;
    let reserved = b.acquired(key, fingerprint, reserved).await?;
    Ok(answer::reservation(key, reserved))
}

pub(crate) async fn reserve_many<B: Backend>(
    b: &B,
    items: &[(Key, Fingerprint)],
) -> Result<Vec<Result<Reservation, Error>>, Error> {
    let ops: Vec<(Key, Reserve)> = items
        .iter()
        .map(|(key, fingerprint)| {
            let op = Reserve {
                fingerprint: *fingerprint,
            };
            (key.clone(), op)
        })
        .collect();
    let outcomes = b.decide_write_many(&ops, true).await?;
    let mut answers = Vec::with_capacity(items.len());
    for (outcome, (key, fingerprint)) in outcomes.into_iter().zip(items) {
        answers.push(match outcome {
            Ok(reserved) => b
                .acquired(key, *fingerprint, reserved)
                .await
                .map(|reserved| answer::reservation(key, reserved)),
            Err(error) => Err(error),
        });
    }
    Ok(answers)
}

/// The completion of `lease` with `result`, checked against the result limit.
pub(crate) fn completion<B: Backend>(
    b: &B,
    lease: &Lease,
    result: Vec<u8>,
) -> Result<Complete, Error> {
    check_result(b, &lease.key, &result)?;
    Ok(Complete {
        token: lease.token,
        result,
    })
}

/// Writes `op` as [`Backend::decide_write`] does, decided with `retention` instead of the
/// key's operation's when one is given.
async fn with_retention<B: Backend, O: Operation + Clone + Sync>(
    b: &B,
    key: &Key,
    op: O,
    retention: Option<Duration>,
) -> Result<O::Outcome, Error> {
    match retention {
        None => b.decide_write(key, op, false).await,
        Some(retention) => {
            let retention = duration_millis(retention);
            let op = WithRetention { op, retention };
            b.decide_write(key, op, false).await
        }
    }
}

pub(crate) async fn complete<B: Backend>(
    b: &B,
    lease: &Lease,
    result: Vec<u8>,
    retention: Option<Duration>,
) -> Result<(), Error> {
    let op = completion(b, lease, result)?;
    answer::completion(lease, with_retention(b, &lease.key, op, retention).await?)
}

pub(crate) async fn record_step<B: Backend>(
    b: &B,
    lease: &Lease,
    step: u32,
    data: &[u8],
) -> Result<(), Error> {
    check_result(b, &lease.key, data)?;
    let op = RecordStep {
        token: lease.token,
        progress: Progress {
            step,
            data: data.to_vec(),
        },
    };
    answer::with_lease(lease, b.decide_write(&lease.key, op, false).await?)
}

pub(crate) async fn release_if_pending<B: Backend>(b: &B, lease: &Lease) -> Result<bool, Error> {
    let op = Release { token: lease.token };
    answer::with_lease(lease, b.decide_write(&lease.key, op, false).await?)
}

pub(crate) async fn extend<B: Backend>(b: &B, lease: &Lease) -> Result<Lease, Error> {
    let op = Extend { token: lease.token };
    extended(lease, b.decide_write(&lease.key, op, false).await?)
}

pub(crate) async fn mark_needs_review<B: Backend>(
    b: &B,
    lease: &Lease,
    note: &str,
) -> Result<(), Error> {
    if note.len() > Key::MAX_NOTE_LEN {
        return Err(Error::NoteTooLarge {
            key: lease.key.clone(),
            len: note.len(),
        });
    }
    let op = MarkNeedsReview {
        token: lease.token,
        note: note.to_string(),
    };
    answer::with_lease(lease, b.decide_write(&lease.key, op, false).await?)
}

pub(crate) async fn resolve<B: Backend>(
    b: &B,
    key: &Key,
    resolution: Resolution,
    retention: Option<Duration>,
) -> Result<(), Error> {
    if let Resolution::Complete(result) = &resolution {
        check_result(b, key, result)?;
    }
    let op = Resolve(resolution);
    answer::resolved(key, with_retention(b, key, op, retention).await?)
}

pub(crate) async fn expire<B: Backend>(
    b: &B,
    key: &Key,
    live: LiveLease,
) -> Result<Option<RecordClass>, Error> {
    let op = Expire {
        force: live == LiveLease::Take,
    };
    answer::expired(key, b.decide_write(key, op, false).await?)
}

pub(crate) async fn observe<B: Backend>(b: &B, key: &Key, window: Duration) -> Result<Seen, Error> {
    let op = Observe {
        window: duration_millis(window),
    };
    Ok(answer::seen(b.decide_write(key, op, true).await?))
}

pub(crate) async fn observe_many<B: Backend>(
    b: &B,
    keys: &[Key],
    window: Duration,
) -> Result<Vec<Result<Seen, Error>>, Error> {
    let op = Observe {
        window: duration_millis(window),
    };
    Ok(each_key(b, keys, op, true)
        .await?
        .into_iter()
        .map(|outcome| outcome.map(answer::seen))
        .collect())
}

pub(crate) async fn complete_many<B: Backend>(
    b: &B,
    items: Vec<(&Lease, Vec<u8>)>,
) -> Result<Vec<Result<(), Error>>, Error> {
    let leases: Vec<&Lease> = items.iter().map(|(lease, _)| *lease).collect();
    let ops = items
        .into_iter()
        .map(|(lease, result)| (lease.key.clone(), completion(b, lease, result)));
    run_many(b, &leases, ops, answer::completion).await
}

pub(crate) async fn release_if_pending_many<B: Backend>(
    b: &B,
    leases: &[&Lease],
) -> Result<Vec<Result<bool, Error>>, Error> {
    let ops = leases
        .iter()
        .map(|lease| (lease.key.clone(), Ok(Release { token: lease.token })));
    run_many(b, leases, ops, answer::with_lease).await
}

pub(crate) async fn extend_many<B: Backend>(
    b: &B,
    leases: &[&Lease],
) -> Result<Vec<Result<Lease, Error>>, Error> {
    let ops = leases
        .iter()
        .map(|lease| (lease.key.clone(), Ok(Extend { token: lease.token })));
    run_many(b, leases, ops, extended).await
}

pub(crate) async fn expire_many<B: Backend>(
    b: &B,
    keys: &[Key],
    live: LiveLease,
) -> Result<Vec<Result<Option<RecordClass>, Error>>, Error> {
    let op = Expire {
        force: live == LiveLease::Take,
    };
    Ok(each_key(b, keys, op, false)
        .await?
        .into_iter()
        .zip(keys)
        .map(|(outcome, key)| outcome.and_then(|outcome| answer::expired(key, outcome)))
        .collect())
}

pub(crate) async fn get<B: Backend>(b: &B, key: &Key) -> Result<Option<Record>, Error> {
    let now = b.now();
    Ok(b.read_record(key)
        .await?
        .filter(|record| !record.is_expired(now)))
}

/// The same operation on each of `keys`, in few round trips.
async fn each_key<B: Backend, O: Operation + Clone + Sync>(
    b: &B,
    keys: &[Key],
    op: O,
    absent_first: bool,
) -> Result<Vec<Result<O::Outcome, Error>>, Error> {
    let ops: Vec<(Key, O)> = keys.iter().map(|key| (key.clone(), op.clone())).collect();
    b.decide_write_many(&ops, absent_first).await
}

/// One operation per lease, the items refused before sending (a result over the limit)
/// answered with their error; the rest applied together and mapped by `map`.
async fn run_many<B: Backend, O, T>(
    b: &B,
    leases: &[&Lease],
    ops: impl IntoIterator<Item = (Key, Result<O, Error>)>,
    map: impl Fn(&Lease, O::Outcome) -> Result<T, Error>,
) -> Result<Vec<Result<T, Error>>, Error>
where
    O: Operation + Clone + Sync,
{
    let mut refused = Vec::new();
    let mut sent = Vec::new();
    for (key, op) in ops {
        match op {
            Ok(op) => {
                refused.push(None);
                sent.push((key, op));
            }
            Err(error) => refused.push(Some(error)),
        }
    }
    let mut outcomes = b.decide_write_many(&sent, false).await?.into_iter();
    Ok(refused
        .into_iter()
        .zip(leases)
        .map(|(refused, lease)| match refused {
            Some(error) => Err(error),
            None => outcomes
                .next()
                .expect("one outcome per sent item")
                .and_then(|outcome| map(lease, outcome)),
        })
        .collect())
}

/// An extension's answer: the lease, renewed until the new deadline.
fn extended(lease: &Lease, outcome: LeaseOutcome<Millis>) -> Result<Lease, Error> {
    let lease_until = answer::with_lease(lease, outcome)?;
    Ok(Lease {
        lease_until: from_millis(lease_until),
        ..lease.clone()
    })
}
