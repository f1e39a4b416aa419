//! What a run does on each thread: the workloads, and filling a store before a run.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{splitmix64, BenchKey, BenchResult, Engine, Fresh, Handle, RESULT};

/// The operation stream a run sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Each step reserves a key never seen before (one durable write).
    Reserve,
    /// Each step reserves a random key of the prefilled ones (completed: a replay, no write).
    Duplicate,
    /// 90% of steps are duplicates of prefilled keys, 10% reserve new keys.
    Mixed,
    /// Each step reserves a new key and completes it with a 64-byte result (two durable
    /// writes).
    Complete,
    /// Each step reserves a batch of new keys with `reserve_many`.
    Batch,
    /// Each step reserves a batch of prefilled (completed) keys with `reserve_many`: no write.
    BatchDuplicate,
}

impl Workload {
    /// Every workload, in the order help texts list them.
    pub const ALL: [Workload; 6] = [
        Workload::Reserve,
        Workload::Duplicate,
        Workload::Mixed,
        Workload::Complete,
        Workload::Batch,
        Workload::BatchDuplicate,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Reserve => "reserve",
            Workload::Duplicate => "duplicate",
            Workload::Mixed => "mixed",
            Workload::Complete => "complete",
            Workload::Batch => "batch",
            Workload::BatchDuplicate => "batch-duplicate",
        }
    }

    /// Whether the run needs prefilled keys.
    pub fn needs_prefill(self) -> bool {
        matches!(
            self,
            Workload::Duplicate | Workload::Mixed | Workload::BatchDuplicate
        )
    }

    /// One line on what a step is.
    pub fn describe(self) -> &'static str {
        match self {
            Workload::Reserve => "durable reserve of a new key per op",
            Workload::Duplicate => "reserve of an existing, completed key per op (no write)",
            Workload::Mixed => "90% duplicates of existing keys, 10% durable reserves of new keys",
            Workload::Complete => "durable reserve of a new key, then durable complete (one op)",
            Workload::Batch => "reserve_many of new keys; ops count keys, latency is per batch",
            Workload::BatchDuplicate => {
                "reserve_many of stored keys (no write); ops count keys, latency is per batch"
            }
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Workload {
    type Err = String;

    fn from_str(s: &str) -> Result<Workload, String> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Workload::ALL.iter().map(|w| w.name()).collect();
                format!(
                    "unknown workload {s:?}; expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// One thread's operation stream: knows which keys are new and which exist, and checks that
/// each answer is the one expected (a fresh key must be new, a prefilled one a duplicate).
pub struct Driver<'a> {
    workload: Workload,
    batch: usize,
    fresh: &'a Fresh,
    existing: Range<u64>,
    rng: u64,
    keys: Vec<BenchKey>,
}

impl<'a> Driver<'a> {
    /// A stream for thread `thread`: new keys come from `fresh`, duplicates from `existing`
    /// (the prefilled key numbers), batches have `batch` keys.
    pub fn new(
        workload: Workload,
        batch: usize,
        fresh: &'a Fresh,
        existing: Range<u64>,
        thread: usize,
    ) -> Driver<'a> {
        Driver {
            workload,
            batch: batch.max(1),
            fresh,
            existing,
            rng: splitmix64(0x1de5_7012 ^ thread as u64),
            keys: Vec::new(),
        }
    }

    /// Keys one step handles (what ops/s counts).
    pub fn keys_per_step(&self) -> u64 {
        match self.workload {
            Workload::Batch | Workload::BatchDuplicate => self.batch as u64,
            _ => 1,
        }
    }

    fn random(&mut self) -> u64 {
        self.rng = splitmix64(self.rng);
        self.rng
    }

    fn new_key(&self) -> BenchKey {
        BenchKey::new(self.fresh.take(1).start)
    }

    fn existing_key(&mut self) -> BenchResult<BenchKey> {
        let len = self.existing.end - self.existing.start;
        if len == 0 {
            return Err(format!("the {} workload needs prefilled keys", self.workload).into());
        }
        Ok(BenchKey::new(self.existing.start + self.random() % len))
    }

    /// Runs one step.
    pub fn step<H: Handle>(&mut self, handle: &mut H) -> BenchResult<()> {
        match self.workload {
            Workload::Reserve => reserve_new(handle, &self.new_key()).map(drop),
            Workload::Duplicate => reserve_duplicate(handle, &self.existing_key()?),
            Workload::Mixed => {
                if self.random().is_multiple_of(10) {
                    reserve_new(handle, &self.new_key()).map(drop)
                } else {
                    reserve_duplicate(handle, &self.existing_key()?)
                }
            }
            Workload::Complete => {
                let key = self.new_key();
                let lease = reserve_new(handle, &key)?;
                handle.complete(&key, lease, RESULT)
            }
            Workload::Batch => {
                let numbers = self.fresh.take(self.batch as u64);
                self.keys.clear();
                self.keys.extend(numbers.map(BenchKey::new));
                let new = handle.reserve_many(&self.keys)?;
                if new == self.keys.len() {
                    Ok(())
                } else {
                    Err(format!("reserve_many of {} new keys found {new} new", self.batch).into())
                }
            }
            Workload::BatchDuplicate => {
                // A run of consecutive stored key numbers from a random start (wrapping), so a
                // batch never names a key twice.
                let len = self.existing.end - self.existing.start;
                if len < self.batch as u64 {
                    return Err(format!(
                        "the {} workload needs at least {} prefilled keys, not {len}",
                        self.workload, self.batch
                    )
                    .into());
                }
                let first = self.random() % len;
                self.keys.clear();
                self.keys.extend(
                    (0..self.batch as u64)
                        .map(|i| BenchKey::new(self.existing.start + (first + i) % len)),
                );
                match handle.reserve_many(&self.keys)? {
                    0 => Ok(()),
                    new => Err(format!("reserve_many of stored keys found {new} new").into()),
                }
            }
        }
    }
}

fn reserve_new<H: Handle>(handle: &mut H, key: &BenchKey) -> BenchResult<H::Lease> {
    handle
        .reserve(key)?
        .ok_or_else(|| format!("new key {key} was reported as a duplicate").into())
}

fn reserve_duplicate<H: Handle>(handle: &mut H, key: &BenchKey) -> BenchResult<()> {
    match handle.reserve(key)? {
        None => Ok(()),
        Some(_) => Err(format!("stored key {key} was reserved again").into()),
    }
}

/// Stores `count` new keys as completed (in chunks of up to 1000, from
/// [`Engine::FILL_THREADS`] threads) and returns their key numbers. `progress` is told how
/// many keys are done so far.
pub fn prefill<E: Engine>(
    engine: &E,
    fresh: &Fresh,
    count: u64,
    progress: &(dyn Fn(u64) + Sync),
) -> BenchResult<Range<u64>> {
    let threads = E::FILL_THREADS.max(1);
    let chunk_len = count.div_ceil(threads as u64).clamp(1, 1000);
    let keys = fresh.take(count);
    let next = AtomicU64::new(keys.start);
    let done = AtomicU64::new(0);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> BenchResult<()> {
                    let mut handle = engine.handle()?;
                    let mut chunk = Vec::with_capacity(chunk_len as usize);
                    loop {
                        let start = next.fetch_add(chunk_len, Ordering::Relaxed);
                        if start >= keys.end {
                            return Ok(());
                        }
                        chunk.clear();
                        chunk.extend((start..keys.end.min(start + chunk_len)).map(BenchKey::new));
                        handle.fill(&chunk, RESULT)?;
                        let len = chunk.len() as u64;
                        progress(done.fetch_add(len, Ordering::Relaxed) + len);
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|worker| worker.join().expect("a prefill thread panicked"))
    })?;
    progress(count);
    Ok(keys)
}
