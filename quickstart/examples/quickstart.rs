//! A purchase service guarded by idempotency keys, end to end.
//!
//! ```text
//! cargo run --release --example quickstart
//! ```
//!
//! It creates a store in a temporary directory and sends purchase requests to a small shop:
//! a fresh request and its retry, the same key from another user, four copies of one request
//! at once from four threads, a reused key with a different body, and a request whose payment
//! fails and is retried. It prints one line per request with the answer it got (`201`, `409`,
//! `422`, `502`, and `replayed` when the stored response came back instead of the work running
//! again). Then it closes the store, reads the file back, checks that every successful key
//! created exactly one order and took one item from stock, prints a summary, and exits
//! non-zero if not.
//!
//! Order numbers are the reservations' fencing tokens, so the failed attempt leaves a gap.

use std::collections::HashSet;
use std::error::Error;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use idemstore::redb::TableDefinition;
use idemstore::redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata};
use idemstore::{Fingerprint, Key, Lease, Reservation, Store};

/// The shop's own tables, in the store's file, written in the same transaction as completions.
const STOCK: TableDefinition<&str, u64> = TableDefinition::new("shop.stock");
const ORDERS: TableDefinition<u64, &str> = TableDefinition::new("shop.orders");
const INITIAL_STOCK: u64 = 10;

type Res<T> = Result<T, Box<dyn Error>>;

/// What the service answers: a status and a body, stored as they are and replayed to duplicates.
struct Response {
    text: String,
    replayed: bool,
}

impl Response {
    fn status(&self) -> &str {
        self.text.get(..3).unwrap_or("???")
    }
}

fn answer(status: u16, body: impl Into<String>) -> Res<Response> {
    let text = format!("{status} {}", body.into());
    Ok(Response {
        text,
        replayed: false,
    })
}

struct Shop {
    store: Store,
    /// Payments taken: must equal the orders in the file at the end.
    payments: AtomicUsize,
    /// Makes the next payment fail, as a gateway timeout would.
    fail_next_payment: AtomicBool,
}

impl Shop {
    /// `POST /purchase` with the client's `Idempotency-Key` and a body such as `"book x1"`.
    fn purchase(&self, user: &str, idem_key: &str, body: &str) -> Res<Response> {
        let key = Key::new(user, "purchase", idem_key)?;
        let lease = match self.store.reserve(&key, Fingerprint::of(body))? {
            Reservation::Acquired(lease) => lease,
            Reservation::Completed(done) => {
                let text = String::from_utf8(done.result)?;
                return Ok(Response {
                    text,
                    replayed: true,
                });
            }
            Reservation::InProgress { retry_after, .. } => {
                let secs = retry_after.as_secs_f64().ceil();
                return answer(409, format!("in progress; Retry-After: {secs}"));
            }
            Reservation::Mismatch => return answer(422, "key reused with a different body"),
            Reservation::NeedsReview { note } => return answer(409, format!("on hold: {note}")),
            other => return Err(format!("unexpected reservation {other:?}").into()),
        };
        self.work(&lease, body).or_else(|failure| {
            // Nothing was committed: free the key so that a retry runs the work again
            // instead of getting the failure replayed.
            let released = self.store.release_if_pending(&lease)?;
            let key = if released { "released" } else { "not pending" };
            answer(502, format!("{failure}; key {key}, nothing cached"))
        })
    }

    /// The non-idempotent work: take the payment, then take the item from stock, create the
    /// order and store the response in one transaction.
    fn work(&self, lease: &Lease, body: &str) -> Res<Response> {
        thread::sleep(Duration::from_millis(100)); // the payment gateway is slow
        if self.fail_next_payment.swap(false, SeqCst) {
            return Err("payment gateway timed out".into());
        }
        self.payments.fetch_add(1, SeqCst);
        let item = body.split_whitespace().next().unwrap_or("nothing");
        // Fencing tokens are unique and never reused, even across restarts.
        let order = lease.token();
        let response = answer(201, format!("order #{order} placed: {body}"))?;
        let key = lease.key().to_string();
        self.store
            .complete_with(lease, response.text.clone(), |txn| {
                let mut stock = txn.open_table(STOCK)?;
                let left = stock.get(item)?.map_or(INITIAL_STOCK, |v| v.value());
                stock.insert(item, left.checked_sub(1).ok_or("sold out")?)?;
                txn.open_table(ORDERS)?.insert(order, key.as_str())?;
                Ok::<_, Box<dyn Error + Send + Sync>>(())
            })?;
        Ok(response)
    }
}

fn show(user: &str, key: &str, body: &str, note: &str, response: &Response) {
    let replayed = if response.replayed {
        "  (replayed: work not run again)"
    } else {
        ""
    };
    let text = &response.text;
    println!("  {user:<5} {key:<4} {body:<8} {note:<8} -> {text}{replayed}");
}

fn main() -> Res<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("shop.idem");
    let shop = Shop {
        store: Store::open(&path)?,
        payments: AtomicUsize::new(0),
        fail_next_payment: AtomicBool::new(false),
    };
    println!("purchase service, store {}\n", path.display());
    let mut succeeded = HashSet::new();
    let mut send = |user: &str, key: &str, body: &str| -> Res<Response> {
        let response = shop.purchase(user, key, body)?;
        show(user, key, body, "", &response);
        if response.status() == "201" {
            succeeded.insert(format!("{user}/{key}"));
        }
        Ok(response)
    };

    println!("1. A fresh request does the work; its retry gets the stored response:");
    let first = send("alice", "k-1", "book x1")?;
    let retry = send("alice", "k-1", "book x1")?;
    check(retry.replayed && retry.text == first.text, "retry replays")?;

    println!("\n2. Keys are per user: bob's k-1 is not alice's k-1:");
    let bob = send("bob", "k-1", "book x1")?;
    check(bob.status() == "201" && !bob.replayed, "keys per user")?;

    println!("\n3. Four copies of one request at once, from four threads; one does the work:");
    let barrier = Barrier::new(4);
    let copy = || {
        barrier.wait();
        let response = shop.purchase("carol", "k-7", "pen x3");
        response.map_err(|e| e.to_string())
    };
    let answers: Vec<_> = thread::scope(|s| {
        let threads: Vec<_> = (0..4).map(|_| s.spawn(copy)).collect();
        threads.into_iter().map(|t| t.join()).collect()
    });
    let mut ran = 0;
    for (i, answer) in answers.into_iter().enumerate() {
        let response = answer.map_err(|_| "a request thread panicked")??;
        ran += usize::from(response.status() == "201" && !response.replayed);
        show("carol", "k-7", "pen x3", &format!("thread {i}"), &response);
    }
    check(ran == 1, "one copy did the work")?;
    let late = send("carol", "k-7", "pen x3")?;
    check(late.replayed, "a late copy is replayed")?;

    println!("\n4. The same key with a different body is a client bug, not a retry:");
    let reused = send("alice", "k-1", "book x5")?;
    check(reused.status() == "422", "reused key refused")?;

    println!("\n5. A failure is not cached: the key is released and the retry does the work:");
    shop.fail_next_payment.store(true, SeqCst);
    let failed = send("dave", "k-9", "lamp x1")?;
    let retried = send("dave", "k-9", "lamp x1")?;
    check(failed.status() == "502", "the payment failed")?;
    check(retried.status() == "201", "the retry succeeded")?;

    // Close the store and read back what was really committed.
    let payments = shop.payments.load(SeqCst) as u64;
    drop(shop);
    let db = idemstore::open_redb_read_only(&path)?;
    let txn = db.begin_read()?;
    let orders = txn.open_table(ORDERS)?.len()?;
    let stock = txn.open_table(STOCK)?;
    let books = stock.get("book")?.map_or(INITIAL_STOCK, |v| v.value());
    let keys = succeeded.len() as u64;
    println!("\nsummary, read back from the file:");
    println!("  {orders} orders, {keys} distinct successful keys, {payments} payments taken");
    println!("  {books} of {INITIAL_STOCK} books left in stock");
    check(orders == keys, "one order per successful key")?;
    check(payments == orders, "one payment per order")?;
    check(books == INITIAL_STOCK - 2, "two books sold")?;
    println!("ok: every request's work ran exactly once");
    Ok(())
}

/// Fails the run (a non-zero exit) when an invariant does not hold.
fn check(holds: bool, invariant: &str) -> Res<()> {
    if holds {
        Ok(())
    } else {
        Err(format!("invariant violated: {invariant}").into())
    }
}
