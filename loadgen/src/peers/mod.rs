//! The engines a user would pick instead of idemstore, behind one small trait (after redb's
//! `BenchDatabase` in `crates/redb-bench-compare`), and the workloads run against them.
//!
//! Shared by `benches/engine.rs` (criterion, which includes it with `#[path]`) and the load
//! generator (`src/main.rs`), so both measure exactly the same code.
//!
//! The workload everywhere: a durable insert-if-absent ("reserve") of a ~24-byte key with a
//! 32-byte request fingerprint, and a completion that stores a 64-byte result.
//!
//! | engine | reserve | complete | reserve_many |
//! |---|---|---|---|
//! | `idemstore` | `Store::reserve`, `Store::open` defaults (durable) | `Store::complete` with the lease | `Store::reserve_many` (one shared commit) |
//! | `idemstore-prealloc` | same, with `preallocate_log(true)` | same | same |
//! | `idemstore-nopages` (asked for by name only) | same as `idemstore`, on a store file without the page checksums (benchmark-only) | same | same |
//! | `redb-ceiling`, `redb-ceiling-1g` (asked for by name only; page cache 64 MiB, 1 GiB) | not durable: the record and deadline inserts of a new key in a write transaction kept open and committed with `Durability::None` every 100 ms | same | same, for all the keys |
//! | `redis` | `SET key fp NX` (+ `GET` on a duplicate), `appendfsync always` | `SET` | a pipeline |
//! | `redb` | read transaction; if absent, one write transaction (`Durability::Immediate`) | one write transaction | one read transaction for all keys; one write transaction for the absent ones |
//! | `sqlite` | `INSERT … ON CONFLICT DO NOTHING` in its own transaction, WAL, `synchronous=FULL` | `UPDATE` in its own transaction | one `BEGIN IMMEDIATE` transaction |
//! | `fdatasync` | in-memory set; a new key overwrites a preallocated 4 KiB block + `fdatasync` | same | one write + one `fdatasync` |
//! | `fjall` | point read; if absent (under a mutex, as a plain keyspace has no insert-if-absent) `insert`, then `persist(PersistMode::SyncData)` | `insert` + `persist(SyncData)` | reads and inserts, one `persist(SyncData)` per batch |
//! | `etcd` (feature `etcd`) | `EtcdStore::reserve` on a 3-member loopback cluster the run starts | `EtcdStore::complete` | `EtcdStore::reserve_many` |
//! | `etcd-bare` (feature `etcd`) | one `create_revision == 0` transaction: put, else get (same client, own cluster) | one put under a `mod_revision` compare | one such transaction per 128 keys, all in flight at once |
//! | `grouplog` | in-memory set; a new key's frame joins the next group commit: one committer thread overwrites a preallocated file in place, one `fdatasync` per group | same | one frame in one group |
//!
//! `fdatasync` is the physical limit of one durable write per operation on this disk, not a
//! store: no index on disk, no recovery, one mutex around the file. `grouplog` is the ceiling
//! for callers that block until their write is durable: group commit with nothing else (no
//! state machine, no index, no recovery), so the gap between it and idemstore is the engine's
//! cost, and the gap between it and Redis is what any such engine could gain on this machine.
//!
//! Duplicates (a reserve of a stored key) never write on any engine: idemstore and redb answer
//! them from a read transaction, Redis's `SET NX` of a present key appends nothing, SQLite's conflicting insert changes no page, and `fdatasync`
//! answers from its in-memory set. redb and SQLite also read back the stored fingerprint of a
//! duplicate and compare it, as an idempotency layer must; so does Redis, with a `GET`.
//!
//! Redis runs as a server the benchmark starts itself (`redis-server` from the system's
//! packages); without it that engine is skipped with a message saying how to install it.

#![allow(
    dead_code,
    reason = "included by both `benches/engine.rs` and the load generator (`src/main.rs`), which each use a part"
)]

#[cfg(feature = "etcd")]
mod etcd;
mod fdatasync;
mod fjall;
mod grouplog;
mod redb_ceiling;
mod redb_txn;
mod redis;
mod sqlite;
mod store;
mod workload;

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

pub use fdatasync::Fdatasync;
pub use fjall::Fjall;
pub use grouplog::GroupLog;
pub use redb_ceiling::{RedbCeiling, RedbCeiling1g};
pub use redb_txn::RedbTxn;
pub use redis::Redis;
pub use sqlite::Sqlite;
pub use store::{Idemstore, IdemstoreNoPages, IdemstorePrealloc};
pub use workload::{prefill, Driver, Workload};

/// Any engine's error, with a message that names the engine and the step.
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;
/// A `Result` with [`BenchError`].
pub type BenchResult<T> = Result<T, BenchError>;

/// The result a completion stores: 64 bytes, about an HTTP status line and a small body.
pub const RESULT: &[u8; 64] =
    b"201 Created {\"id\":\"ch_3PzK1c2eZvKYlo2C\",\"amount\":1999,\"ok\":true}";

/// One engine, opened on a fresh directory. Shared by all threads of a run.
pub trait Engine: Sync + Sized {
    /// The name used in bench ids and the load generator's table.
    const NAME: &'static str;
    /// How many threads [`prefill`] should use: 1 unless concurrent callers share commits.
    const FILL_THREADS: usize = 1;
    /// A per-thread handle (SQLite: a connection per thread).
    type Handle: Handle + Send;

    /// Whether the engine can run on this machine; `Err` says why not and how to fix it (the
    /// runners then skip it with that message).
    fn available() -> Result<(), String> {
        Ok(())
    }

    /// Creates the engine's files in `dir`, which is empty.
    fn open(dir: &Path) -> BenchResult<Self>;

    /// A handle for the calling thread.
    fn handle(&self) -> BenchResult<Self::Handle>;
}

/// The operations measured, on one thread.
pub trait Handle {
    /// What [`complete`](Handle::complete) needs from the reserve that won the key (idemstore:
    /// its `Lease`; the others need nothing).
    type Lease;

    /// Durably inserts `key` if absent. `Some` when this call reserved it (new), `None` when it
    /// was already there (a duplicate).
    fn reserve(&mut self, key: &BenchKey) -> BenchResult<Option<Self::Lease>>;

    /// Durably stores `result` for a key this handle reserved.
    fn complete(&mut self, key: &BenchKey, lease: Self::Lease, result: &[u8]) -> BenchResult<()>;

    /// Reserves every key, in one durable transaction where the engine can; returns how many
    /// were new.
    fn reserve_many(&mut self, keys: &[BenchKey]) -> BenchResult<usize>;

    /// Set-up, not measured: stores `keys` as completed with `result`, as fast as the engine
    /// allows (the default reserves and completes each key).
    fn fill(&mut self, keys: &[BenchKey], result: &[u8]) -> BenchResult<()> {
        for key in keys {
            let lease = self
                .reserve(key)?
                .ok_or_else(|| format!("prefill: key {key} was already stored"))?;
            self.complete(key, lease, result)?;
        }
        Ok(())
    }
}

/// A benchmark key: scope `t042`, operation `pay`, id of 16 hex digits (25 bytes flat, 26 in
/// idemstore's length-prefixed encoding), and the request's 64-byte body, whose 32-byte
/// fingerprint every engine computes on each use (`Fingerprint::of`, BLAKE3), as a service
/// hashes each request it receives.
///
/// Key number `n` maps to a pseudo-random id (a bijection), so keys land all over the B-tree as
/// client-generated keys do, and distinct numbers never collide.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BenchKey {
    flat: [u8; BenchKey::FLAT_LEN],
    body: [u8; 64],
}

impl BenchKey {
    /// Length of [`flat`](BenchKey::flat): `t042:pay:0123456789abcdef`.
    pub const FLAT_LEN: usize = 25;
    /// The operation part of every key.
    pub const OPERATION: &'static [u8] = b"pay";

    /// Key number `n`.
    pub fn new(n: u64) -> BenchKey {
        let h = splitmix64(n);
        let mut flat = *b"t000:pay:0000000000000000";
        let tenant = (h >> 40) % 1000;
        flat[1] = b'0' + (tenant / 100) as u8;
        flat[2] = b'0' + (tenant / 10 % 10) as u8;
        flat[3] = b'0' + (tenant % 10) as u8;
        for (i, byte) in flat[9..].iter_mut().enumerate() {
            *byte = b"0123456789abcdef"[(h >> (60 - 4 * i) & 0xf) as usize];
        }
        let mut body = [0; 64];
        for (i, chunk) in body.chunks_exact_mut(8).enumerate() {
            chunk.copy_from_slice(&splitmix64(h ^ i as u64).to_le_bytes());
        }
        BenchKey { flat, body }
    }

    /// The key as one byte string, for engines without structured keys.
    pub fn flat(&self) -> &[u8; BenchKey::FLAT_LEN] {
        &self.flat
    }

    /// The scope (tenant) part.
    pub fn scope(&self) -> &[u8] {
        &self.flat[..4]
    }

    /// The client's id part.
    pub fn id(&self) -> &[u8] {
        &self.flat[9..]
    }

    /// The request's body.
    pub fn body(&self) -> &[u8; 64] {
        &self.body
    }

    /// The request's fingerprint, hashed from the body on each call.
    pub fn fingerprint(&self) -> [u8; 32] {
        *idemstore::Fingerprint::of(self.body).as_bytes()
    }
}

impl fmt::Display for BenchKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.flat))
    }
}

impl fmt::Debug for BenchKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BenchKey({self})")
    }
}

/// Hands out key numbers never used before in this run, to any number of threads.
#[derive(Debug, Default)]
pub struct Fresh(AtomicU64);

impl Fresh {
    /// The next `n` unused key numbers.
    pub fn take(&self, n: u64) -> std::ops::Range<u64> {
        let start = self.0.fetch_add(n, Ordering::Relaxed);
        start..start + n
    }
}

/// The engines, by name, for command lines and loops over all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// [`Idemstore`].
    Idemstore,
    /// [`IdemstorePrealloc`].
    IdemstorePrealloc,
    /// [`IdemstoreNoPages`] (not in [`Kind::ALL`]: asked for by name, to measure the page
    /// checksums' cost against `idemstore` in the same run).
    IdemstoreNoPages,
    /// [`Redis`].
    Redis,
    /// [`RedbTxn`].
    Redb,
    /// [`RedbCeiling`] (by name only): redb's inserts alone, not durable.
    RedbCeiling,
    /// [`RedbCeiling1g`] (by name only): the same with redb's default page cache.
    RedbCeiling1g,
    /// [`Sqlite`].
    Sqlite,
    /// [`Fdatasync`].
    Fdatasync,
    /// [`GroupLog`].
    GroupLog,
    /// [`Fjall`].
    Fjall,
    /// [`etcd::Etcd`] (feature `etcd`; not in [`Kind::ALL`]: it starts a cluster).
    #[cfg(feature = "etcd")]
    Etcd,
    /// [`etcd::EtcdBare`] (feature `etcd`): the bare insert-if-absent transaction loop on
    /// the same client, the yardstick of [`etcd::Etcd`].
    #[cfg(feature = "etcd")]
    EtcdBare,
}

impl Kind {
    /// Every engine, in the order tables list them.
    pub const ALL: [Kind; 8] = [
        Kind::Idemstore,
        Kind::IdemstorePrealloc,
        Kind::Redis,
        Kind::Redb,
        Kind::Sqlite,
        Kind::Fdatasync,
        Kind::GroupLog,
        Kind::Fjall,
    ];

    /// The engines run only when named (`--engines`), never by default.
    pub const BY_NAME: [Kind; 3] = [
        Kind::IdemstoreNoPages,
        Kind::RedbCeiling,
        Kind::RedbCeiling1g,
    ];

    /// The engines the criterion benchmarks compare (idemstore with its defaults only).
    pub const BENCH: [Kind; 5] = [
        Kind::Idemstore,
        Kind::Redis,
        Kind::Redb,
        Kind::Sqlite,
        Kind::Fdatasync,
    ];

    /// Runs `visitor` with this engine's type.
    pub fn visit<V: Visit>(self, visitor: V) -> V::Output {
        match self {
            Kind::Idemstore => visitor.visit::<Idemstore>(),
            Kind::IdemstorePrealloc => visitor.visit::<IdemstorePrealloc>(),
            Kind::IdemstoreNoPages => visitor.visit::<IdemstoreNoPages>(),
            Kind::Redis => visitor.visit::<Redis>(),
            Kind::Redb => visitor.visit::<RedbTxn>(),
            Kind::RedbCeiling => visitor.visit::<RedbCeiling>(),
            Kind::RedbCeiling1g => visitor.visit::<RedbCeiling1g>(),
            Kind::Sqlite => visitor.visit::<Sqlite>(),
            Kind::Fdatasync => visitor.visit::<Fdatasync>(),
            Kind::GroupLog => visitor.visit::<GroupLog>(),
            Kind::Fjall => visitor.visit::<Fjall>(),
            #[cfg(feature = "etcd")]
            Kind::Etcd => visitor.visit::<etcd::Etcd>(),
            #[cfg(feature = "etcd")]
            Kind::EtcdBare => visitor.visit::<etcd::EtcdBare>(),
        }
    }

    /// Why the engine cannot run here, if it cannot ([`Engine::available`]).
    pub fn available(self) -> Result<(), String> {
        struct Available;
        impl Visit for Available {
            type Output = Result<(), String>;
            fn visit<E: Engine>(self) -> Result<(), String> {
                E::available()
            }
        }
        self.visit(Available)
    }

    /// Whether the engine runs inside this process (its CPU time is this process's); Redis
    /// and etcd are servers of their own.
    pub fn in_process(self) -> bool {
        match self {
            Kind::Redis => false,
            #[cfg(feature = "etcd")]
            Kind::Etcd => false,
            _ => true,
        }
    }

    /// The engine's [`Engine::NAME`].
    pub fn name(self) -> &'static str {
        struct Name;
        impl Visit for Name {
            type Output = &'static str;
            fn visit<E: Engine>(self) -> &'static str {
                E::NAME
            }
        }
        self.visit(Name)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Kind {
    type Err = String;

    fn from_str(s: &str) -> Result<Kind, String> {
        #[cfg(feature = "etcd")]
        if s == "etcd" {
            return Ok(Kind::Etcd);
        }
        #[cfg(feature = "etcd")]
        if s == "etcd-bare" {
            return Ok(Kind::EtcdBare);
        }
        let known = || Kind::ALL.into_iter().chain(Kind::BY_NAME);
        known().find(|kind| kind.name() == s).ok_or_else(|| {
            let names: Vec<_> = known().map(|kind| kind.name()).collect();
            format!("unknown engine {s:?}; expected one of {}", names.join(", "))
        })
    }
}

/// Something generic over the engine type, run by [`Kind::visit`].
pub trait Visit {
    /// What the visit returns.
    type Output;
    /// Runs with engine type `E`.
    fn visit<E: Engine>(self) -> Self::Output;
}

/// SplitMix64: a fast bijection on `u64` with good mixing.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Creates the file at `path` and writes every block of its first `len` bytes once (then
/// syncs), so that later writes overwrite allocated blocks in place, as a preallocated log.
pub(crate) fn preallocated(path: &Path, len: u64, engine: &str) -> BenchResult<std::fs::File> {
    use std::os::unix::fs::FileExt;
    let fail = |e: std::io::Error| format!("{engine}: preallocate {}: {e}", path.display());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(fail)?;
    let zeros = vec![0; 1 << 20];
    for offset in (0..len).step_by(zeros.len()) {
        file.write_all_at(&zeros, offset).map_err(fail)?;
    }
    file.sync_all().map_err(fail)?;
    Ok(file)
}

/// Adds `what` to an error's message.
pub(crate) fn context<E: fmt::Display>(what: &'static str) -> impl FnOnce(E) -> BenchError {
    move |e| format!("{what}: {e}").into()
}
