//! Stale-key recovery: workers that die in the middle of a payment, and the job that cleans up
//! after them by asking the payment provider, with the same idempotency key, what happened.
//!
//! ```text
//! cargo run --example payment_recovery
//! ```
//!
//! A fake payment API in this file honours idempotency keys as Stripe's does: charging twice
//! with one key charges once. Three workers each reserve an order's key, and each "crashes"
//! (drops its lease without completing) at a different point:
//!
//! - `order-1001` after the API charged the card,
//! - `order-1002` before it called the API at all,
//! - `order-1003` while the API call timed out, so nobody knows whether the card was charged.
//!
//! The clock is a [`ManualClock`]: it moves two minutes on, past the 30 s leases. A recovery
//! job then lists the stale reservations with [`Store::stale`] (printing each one's age and
//! attempt), takes each over with [`Store::reserve`] (attempt 2, [`Lease::is_retry`]), asks the
//! API about the same key, and settles it: completes with the API's charge, releases it when
//! the payment never happened, or marks it for review when the API cannot tell. Then the dead
//! worker of `order-1001` comes back and is refused by the fencing token, and the customers'
//! retries arrive: one gets the recovered result, one is charged now (once), one is told the
//! payment is under review. It prints one line per step and ends with the charges the API
//! holds; it exits non-zero if any order was charged twice.

use std::collections::HashMap;
use std::error::Error;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use idemstore::{Fingerprint, Key, Lease, ManualClock, Reservation, Store};

type Res<T> = Result<T, Box<dyn Error>>;

/// What the payment API knows about one idempotency key.
#[derive(Debug, Clone)]
enum Charge {
    /// The card was charged.
    Succeeded { id: String, cents: u64 },
    /// The request reached the API, which lost track of it (a timeout inside the provider).
    Unknown,
}

/// The answer of [`FakePaymentApi::lookup`].
enum Lookup {
    Charged { id: String, cents: u64 },
    NeverSeen,
    CannotTell,
}

/// A payment provider that honours idempotency keys: a second charge with the same key
/// returns the first charge instead of charging again.
#[derive(Default)]
struct FakePaymentApi {
    charges: Mutex<HashMap<String, Charge>>,
    next_id: Mutex<u32>,
}

impl FakePaymentApi {
    /// Charges `cents` under `idempotency_key`; `timeout` simulates a call that dies inside
    /// the provider and returns no answer.
    fn charge(&self, idempotency_key: &str, cents: u64, timeout: bool) -> Result<String, String> {
        let mut charges = self.charges.lock().expect("not poisoned");
        if let Some(Charge::Succeeded { id, .. }) = charges.get(idempotency_key) {
            return Ok(id.clone()); // the same key: the same charge, not a second one
        }
        if timeout {
            charges.insert(idempotency_key.to_string(), Charge::Unknown);
            return Err("gateway timeout after 30 s".into());
        }
        let mut next = self.next_id.lock().expect("not poisoned");
        *next += 1;
        let id = format!("ch_{:04}", *next);
        charges.insert(
            idempotency_key.to_string(),
            Charge::Succeeded {
                id: id.clone(),
                cents,
            },
        );
        Ok(id)
    }

    /// "What happened to the request with this key?"
    fn lookup(&self, idempotency_key: &str) -> Lookup {
        match self
            .charges
            .lock()
            .expect("not poisoned")
            .get(idempotency_key)
        {
            Some(Charge::Succeeded { id, cents }) => Lookup::Charged {
                id: id.clone(),
                cents: *cents,
            },
            Some(Charge::Unknown) => Lookup::CannotTell,
            None => Lookup::NeverSeen,
        }
    }

    fn succeeded(&self) -> Vec<(String, String)> {
        let mut out: Vec<_> = self
            .charges
            .lock()
            .expect("not poisoned")
            .iter()
            .filter_map(|(key, charge)| match charge {
                Charge::Succeeded { id, .. } => Some((key.clone(), id.clone())),
                Charge::Unknown => None,
            })
            .collect();
        out.sort();
        out
    }
}

/// The key the provider sees: the same for every attempt of one order.
fn provider_key(key: &Key) -> String {
    String::from_utf8_lossy(key.id()).into_owned()
}

/// The order's request body; its fingerprint guards against a reused key with other content.
fn body(order: &str, cents: u64) -> String {
    format!("order={order}&amount={cents}")
}

fn receipt(charge_id: &str, cents: u64) -> Vec<u8> {
    format!(
        "201 paid {}.{:02} EUR, charge {charge_id}",
        cents / 100,
        cents % 100
    )
    .into_bytes()
}

fn age(since: SystemTime, now: SystemTime) -> String {
    let secs = now.duration_since(since).unwrap_or_default().as_secs();
    format!("{}m{:02}s", secs / 60, secs % 60)
}

/// A worker that reserves the order's key and stops at `crash_point`.
fn worker(store: &Store, api: &FakePaymentApi, order: &str, cents: u64, crash: &str) -> Res<Lease> {
    let key = Key::new("shop-1", "POST /payments", order)?;
    let Reservation::Acquired(lease) = store.reserve(&key, Fingerprint::of(body(order, cents)))?
    else {
        return Err(format!("{order}: expected a fresh key").into());
    };
    println!(
        "[worker]   {order}: reserved (token {}, attempt {})",
        lease.token(),
        lease.attempt()
    );
    match crash {
        "before-call" => println!("[worker]   {order}: process dies before calling the API"),
        "after-charge" => {
            let id = api.charge(&provider_key(&key), cents, false)?;
            println!("[worker]   {order}: API charged {id}; process dies before complete()");
        }
        _ => {
            let error = api
                .charge(&provider_key(&key), cents, true)
                .expect_err("a timeout");
            println!("[worker]   {order}: API call failed ({error}); process dies");
        }
    }
    Ok(lease) // never completed nor released: the lease just runs out
}

fn main() -> Res<()> {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new();
    let store = Store::builder()
        .lease(Duration::from_secs(30))
        .clock(clock.clone())
        .open(dir.path().join("payments.idem"))?;
    let api = FakePaymentApi::default();

    let orders = [
        ("order-1001", 1_250, "after-charge"),
        ("order-1002", 4_000, "before-call"),
        ("order-1003", 990, "timeout"),
    ];
    let mut dead_leases = Vec::new();
    for (order, cents, crash) in orders {
        dead_leases.push(worker(&store, &api, order, cents, crash)?);
    }

    clock.advance(Duration::from_secs(120));
    println!("[clock]    two minutes later: every 30 s lease has run out");

    // The recovery job, run every minute or so.
    let now = clock.time();
    let stale = store.stale(100)?;
    println!("[recovery] {} stale reservations:", stale.len());
    for (key, record) in &stale {
        let lease_until = match record.status() {
            idemstore::Status::Pending { lease_until, .. } => lease_until,
            _ => now,
        };
        println!(
            "[recovery]   {}  attempt {}  token {}  stale for {}",
            String::from_utf8_lossy(key.id()),
            record.attempt(),
            record.token(),
            age(lease_until, now)
        );
    }
    for (key, record) in stale {
        let order = provider_key(&key);
        // Take it over with the request's own fingerprint: attempt 2, a new fencing token.
        let lease = match store.reserve(&key, record.fingerprint())? {
            Reservation::Acquired(lease) => lease,
            other => {
                println!("[recovery] {order}: someone else got there first ({other:?})");
                continue;
            }
        };
        println!(
            "[recovery] {order}: took over (token {}, attempt {}, is_retry {}); asking the API about key {order}",
            lease.token(),
            lease.attempt(),
            lease.is_retry()
        );
        match api.lookup(&order) {
            Lookup::Charged { id, cents } => {
                store.complete(&lease, receipt(&id, cents))?;
                println!("[recovery] {order}: API says charged {id}: completed with its receipt");
            }
            Lookup::NeverSeen => {
                store.release_if_pending(&lease)?;
                println!("[recovery] {order}: API never saw it: released, the next retry pays");
            }
            Lookup::CannotTell => {
                let note = "payment API cannot tell whether the card was charged";
                store.mark_needs_review(&lease, note)?;
                println!("[recovery] {order}: API cannot tell: marked for review ({note})");
            }
        }
    }

    // The first worker was only slow, not dead: its old lease is refused, nothing changes.
    let late = &dead_leases[0];
    match store.complete(late, b"201 from the old worker".to_vec()) {
        Err(error) => println!("[worker]   order-1001 comes back: refused: {error}"),
        Ok(()) => return Err("a taken-over lease completed the key".into()),
    }

    // The customers retry.
    for (order, cents, _) in orders {
        let key = Key::new("shop-1", "POST /payments", order)?;
        let answer = match store.reserve(&key, Fingerprint::of(body(order, cents)))? {
            Reservation::Completed(done) => {
                format!("replayed: {}", String::from_utf8_lossy(&done.result))
            }
            Reservation::Acquired(lease) => {
                let id = api.charge(&provider_key(&key), cents, false)?;
                store.complete(&lease, receipt(&id, cents))?;
                format!(
                    "charged now as {id} (attempt {}, a fresh key)",
                    lease.attempt()
                )
            }
            Reservation::NeedsReview { note } => format!("409 under review: {note}"),
            other => format!("{other:?}"),
        };
        println!("[client]   {order} retry: {answer}");
    }
    println!(
        "[operator] settle order-1003 once the provider answers, e.g.\n           \
         idemstore resolve payments.idem shop-1 'POST /payments' order-1003 --complete receipt.txt"
    );

    let charges = api.succeeded();
    println!("[api]      charges: {charges:?}");
    if charges.len() != 2 {
        return Err(format!("expected exactly two charges, got {charges:?}").into());
    }
    Ok(())
}
