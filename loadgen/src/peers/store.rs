//! idemstore itself: `reserve`, `complete` with the lease, and `reserve_many` (one shared
//! commit per batch), with `Store::open`'s defaults (what users run), with
//! `preallocate_log(true)`, or without the page checksums (the hidden, benchmark-only
//! `Builder::__without_page_checksums`: the same engine on a plain redb file, to measure the
//! checksummed page layer's cost in the same run).

use std::path::Path;
use std::sync::Arc;

use idemstore::{Error, Fingerprint, Key, Lease, Reservation, Store};

use super::{context, BenchKey, BenchResult, Engine, Handle};

/// The real crate, shared by all threads; `PREALLOCATE` sets `preallocate_log` (the log is
/// then overwritten in place, as the fdatasync peer overwrites a preallocated block); without
/// `PAGES` the store file has no page checksums (benchmarks only).
pub struct IdemstoreWith<const PREALLOCATE: bool, const PAGES: bool = true>(Arc<Store>);

/// idemstore as `Store::open` opens it: the defaults users run.
pub type Idemstore = IdemstoreWith<false>;
/// idemstore with `preallocate_log(true)`.
pub type IdemstorePrealloc = IdemstoreWith<true>;
/// idemstore with `Store::open`'s defaults on a store file without the page checksums.
pub type IdemstoreNoPages = IdemstoreWith<false, false>;

impl<const PREALLOCATE: bool, const PAGES: bool> Engine for IdemstoreWith<PREALLOCATE, PAGES> {
    const NAME: &'static str = match (PREALLOCATE, PAGES) {
        (true, true) => "idemstore-prealloc",
        (false, true) => "idemstore",
        (true, false) => "idemstore-prealloc-nopages",
        (false, false) => "idemstore-nopages",
    };
    /// Concurrent batches share commits.
    const FILL_THREADS: usize = 4;
    type Handle = StoreHandle;

    fn open(dir: &Path) -> BenchResult<Self> {
        let path = dir.join("keys.idem");
        let mut builder = Store::builder();
        if PREALLOCATE {
            builder.preallocate_log(true);
        }
        if !PAGES {
            builder.__without_page_checksums();
        }
        let store = builder.open(path).map_err(context("idemstore: open"))?;
        Ok(IdemstoreWith(Arc::new(store)))
    }

    fn handle(&self) -> BenchResult<StoreHandle> {
        Ok(StoreHandle(Arc::clone(&self.0)))
    }
}

fn idem_key(key: &BenchKey) -> BenchResult<Key> {
    Key::new(key.scope(), BenchKey::OPERATION, key.id()).map_err(context("idemstore: key"))
}

fn items(keys: &[BenchKey]) -> BenchResult<Vec<(Key, Fingerprint)>> {
    keys.iter()
        .map(|key| Ok((idem_key(key)?, Fingerprint::of(key.body()))))
        .collect()
}

/// The lease if the reservation acquired the key, `None` for a duplicate.
fn acquired(key: &BenchKey, reservation: Result<Reservation, Error>) -> BenchResult<Option<Lease>> {
    match reservation.map_err(context("idemstore: reserve"))? {
        Reservation::Acquired(lease) => Ok(Some(lease)),
        Reservation::Completed(_) | Reservation::InProgress { .. } => Ok(None),
        other => Err(format!("idemstore: reserve of {key} answered {other:?}").into()),
    }
}

/// A thread's handle: the shared store.
pub struct StoreHandle(Arc<Store>);

impl Handle for StoreHandle {
    type Lease = Lease;

    fn reserve(&mut self, key: &BenchKey) -> BenchResult<Option<Lease>> {
        let fingerprint = Fingerprint::of(key.body());
        acquired(key, self.0.reserve(&idem_key(key)?, fingerprint))
    }

    fn complete(&mut self, _key: &BenchKey, lease: Lease, result: &[u8]) -> BenchResult<()> {
        self.0
            .complete(&lease, result)
            .map_err(context("idemstore: complete"))
    }

    fn reserve_many(&mut self, keys: &[BenchKey]) -> BenchResult<usize> {
        let items = items(keys)?;
        let mut new = 0;
        for (result, key) in self
            .0
            .reserve_many(&items)
            .map_err(context("idemstore: reserve_many"))?
            .into_iter()
            .zip(keys)
        {
            new += usize::from(acquired(key, result)?.is_some());
        }
        Ok(new)
    }

    fn fill(&mut self, keys: &[BenchKey], result: &[u8]) -> BenchResult<()> {
        let items = items(keys)?;
        let mut leases = Vec::with_capacity(keys.len());
        for (reservation, key) in self
            .0
            .reserve_many(&items)
            .map_err(context("idemstore: prefill"))?
            .into_iter()
            .zip(keys)
        {
            leases.push(
                acquired(key, reservation)?
                    .ok_or_else(|| format!("idemstore: prefill: {key} was already stored"))?,
            );
        }
        let completions = leases
            .iter()
            .map(|lease| (lease, result.to_vec()))
            .collect();
        for completed in self
            .0
            .complete_many(completions)
            .map_err(context("idemstore: prefill"))?
        {
            completed.map_err(context("idemstore: prefill"))?;
        }
        Ok(())
    }
}
