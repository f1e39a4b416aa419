//! Bytes on disk per stored key: fills a store with `N` completed keys (default 100,000) with
//! 64-byte results, 1,000 per batch, closes it cleanly and prints the store file's size per key
//! (the log, which a clean close leaves empty of changes, apart), then, per table, the pages
//! redb's B-tree uses and the bytes stored in its leaves, per key, the pages redb has
//! allocated against the free ones, the file's size after [`idemstore::compact`], and after a
//! tenth more keys are stored on the compacted store.
//!
//! ```text
//! cargo run --release --example space            # 100k keys
//! cargo run --release --example space -- 1000000
//! cargo run --release --example space -- 100000 DIR   # keep the store in DIR
//! ```

use idemstore::redb::{ReadableDatabase, ReadableTableMetadata, TableHandle};
use idemstore::{Fingerprint, Key, Reservation, Store};

/// Stores the completed keys numbered `range`, 1,000 per batch; returns their payload in bytes.
fn fill(store: &Store, range: std::ops::Range<usize>) -> Result<u64, idemstore::Error> {
    let fp = Fingerprint::of(b"fill");
    let result = vec![b'r'; 64];
    let mut payload = 0u64;
    let mut at = range.start;
    while at < range.end {
        let items = (at..range.end.min(at + 1000))
            .map(|i| {
                let spread = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                Ok((Key::new("tenant", "op", format!("key-{spread:016x}"))?, fp))
            })
            .collect::<Result<Vec<_>, idemstore::Error>>()?;
        at += items.len();
        // Key, fingerprint, result and the two deadlines (completion and expiry).
        payload += items
            .iter()
            .map(|(k, _)| {
                (3 + k.scope().len() + k.operation().len() + k.id().len() + 32 + 64 + 16) as u64
            })
            .sum::<u64>();
        let leases: Vec<_> = store
            .reserve_many(&items)?
            .into_iter()
            .filter_map(|r| match r {
                Ok(Reservation::Acquired(lease)) => Some(lease),
                _ => None,
            })
            .collect();
        store.complete_many(leases.iter().map(|l| (l, result.clone())).collect())?;
    }
    Ok(payload)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = match std::env::args().nth(1) {
        Some(arg) => arg.parse()?,
        None => 100_000,
    };
    let dir = tempfile::tempdir()?;
    let path = match std::env::args().nth(2) {
        Some(keep) => std::path::PathBuf::from(keep).join("space.idem"),
        None => dir.path().join("space.idem"),
    };
    let mut builder = Store::builder();
    // An experiment's knob: SPACE_CHECKPOINT_BYTES sets Builder::checkpoint_bytes.
    if let Ok(bytes) = std::env::var("SPACE_CHECKPOINT_BYTES") {
        builder.checkpoint_bytes(bytes.parse()?);
    }
    let store = builder.open(&path)?;
    let payload = fill(&store, 0..n)?;
    drop(store);
    let bytes = std::fs::metadata(&path)?.len();
    println!(
        "{n} completed keys, 64-byte results: store file {bytes} bytes, {:.1} bytes per key \
         (payload {:.1} bytes per key, ratio {:.2})",
        bytes as f64 / n as f64,
        payload as f64 / n as f64,
        bytes as f64 / payload as f64
    );
    let db = idemstore::open_redb_read_only(&path)?;
    let txn = db.begin_read()?;
    let names: Vec<String> = txn.list_tables()?.map(|t| t.name().to_string()).collect();
    for name in names {
        let stats = txn
            .open_untyped_table(idemstore::redb::TableDefinition::<&[u8], &[u8]>::new(&name))?
            .stats()?;
        let pages = stats.leaf_pages() + stats.branch_pages();
        println!(
            "  {name}: {pages} pages, {:.1} bytes per key in pages, {:.1} stored in leaves",
            (pages * 4096) as f64 / n as f64,
            stats.stored_bytes() as f64 / n as f64
        );
    }
    drop(txn);
    drop(db);
    // The pages redb has allocated against the file's length: the rest of the file is free
    // pages (copy-on-write copies released since they were written), kept for reuse.
    let stats = idemstore::open_redb(&path)?.begin_write()?.stats()?;
    let allocated = stats.allocated_pages() * stats.page_size() as u64;
    println!(
        "  redb: {:.1} bytes per key in allocated pages, {:.1} bytes per key in free pages",
        allocated as f64 / n as f64,
        bytes.saturating_sub(allocated) as f64 / n as f64
    );
    // What compacting the closed store gives back (`idemstore::compact`), and what it costs.
    let started = std::time::Instant::now();
    let (_, after) = idemstore::compact(&path)?;
    println!(
        "  after idemstore::compact ({:.2} s): store file {after} bytes, {:.1} bytes per key \
         (ratio {:.2})",
        started.elapsed().as_secs_f64(),
        after as f64 / n as f64,
        after as f64 / payload as f64
    );
    // How fast the room comes back: a tenth more keys on the compacted store.
    let more = n / 10;
    let payload = payload + fill(&builder.open(&path)?, n..n + more)?;
    let regrown = std::fs::metadata(&path)?.len();
    println!(
        "  after {more} keys more: store file {regrown} bytes, {:.1} bytes per key (ratio {:.2})",
        regrown as f64 / (n + more) as f64,
        regrown as f64 / payload as f64
    );
    Ok(())
}
