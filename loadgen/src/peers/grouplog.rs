//! The ceiling of any engine whose callers block until their write is durable: a bare
//! group-commit log. Callers append a framed record to a shared buffer and park; one committer
//! thread takes everything queued, overwrites it in place into a preallocated file, runs one
//! `fdatasync`, and unparks every caller it covered. No state machine, no index, no recovery;
//! an in-memory set tells new keys from duplicates.
//!
//! It is what `../shared/PERF-NOTES.md` calls the prototype ceiling ("dedicated committer,
//! waiters woken singly"), run in the same pass as the other engines so that the distance
//! between idemstore and the disk-and-scheduler limit, and between that limit and Redis, is
//! measured rather than assumed.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle, Thread};

use super::{context, preallocated, BenchKey, BenchResult, Engine, Handle};

/// The preallocated ring the frames are written to, in place: 64 MiB.
const RING: u64 = 64 << 20;

/// A caller waiting for its frame to be durable.
struct Waiter {
    thread: Thread,
    done: Arc<AtomicBool>,
}

#[derive(Default)]
struct Queue {
    /// Frames queued since the committer last took them.
    frames: Vec<u8>,
    waiters: Vec<Waiter>,
    seen: HashSet<[u8; BenchKey::FLAT_LEN]>,
    seq: u64,
    /// The first write or sync error; every later call fails with it.
    failed: Option<String>,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    work: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The bare group-commit log and its committer thread.
pub struct GroupLog {
    shared: Arc<Shared>,
    committer: Mutex<Option<JoinHandle<()>>>,
}

impl Engine for GroupLog {
    const NAME: &'static str = "grouplog";
    const FILL_THREADS: usize = 4;
    type Handle = GroupLogHandle;

    fn open(dir: &Path) -> BenchResult<Self> {
        let file = preallocated(&dir.join("group.log"), RING, "grouplog")?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
        });
        let committer = thread::Builder::new()
            .name("grouplog-committer".into())
            .spawn({
                let shared = Arc::clone(&shared);
                move || commit_loop(&shared, &file)
            })
            .map_err(context("grouplog: start the committer"))?;
        Ok(GroupLog {
            shared,
            committer: Mutex::new(Some(committer)),
        })
    }

    fn handle(&self) -> BenchResult<GroupLogHandle> {
        Ok(GroupLogHandle(Arc::clone(&self.shared)))
    }
}

impl Drop for GroupLog {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.work.notify_one();
        let committer = self
            .committer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(committer) = committer {
            let _ = committer.join();
        }
    }
}

/// Takes every queued frame, writes it in place, syncs once, wakes every caller it covered.
fn commit_loop(shared: &Shared, file: &File) {
    let mut next = 0u64;
    loop {
        let (frames, waiters) = {
            let mut queue = shared.lock();
            while queue.waiters.is_empty() && !queue.shutdown {
                queue = shared
                    .work
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if queue.waiters.is_empty() {
                return;
            }
            (
                std::mem::take(&mut queue.frames),
                std::mem::take(&mut queue.waiters),
            )
        };
        if next + frames.len() as u64 > RING {
            next = 0;
        }
        let written = file
            .write_all_at(&frames, next)
            .and_then(|()| file.sync_data());
        next += frames.len() as u64;
        if let Err(e) = written {
            shared
                .lock()
                .failed
                .get_or_insert(format!("grouplog: write and sync: {e}"));
        }
        for waiter in waiters {
            waiter.done.store(true, Ordering::Release);
            waiter.thread.unpark();
        }
    }
}

/// A thread's handle: the shared queue.
pub struct GroupLogHandle(Arc<Shared>);

impl GroupLogHandle {
    /// Frames each new key's record (key, fingerprint, `result`) into one frame, queues it and
    /// blocks until it is durable; how many keys were new. With `force`, every key is logged
    /// (a completion).
    fn log(&self, keys: &[BenchKey], result: &[u8], force: bool) -> BenchResult<usize> {
        let done = Arc::new(AtomicBool::new(false));
        // Hashed before taking the lock, as every caller of a store does.
        let fingerprints: Vec<[u8; 32]> = keys.iter().map(BenchKey::fingerprint).collect();
        let new = {
            let mut queue = self.0.lock();
            if let Some(failed) = &queue.failed {
                return Err(failed.clone().into());
            }
            let mut payload = Vec::new();
            let mut new = 0;
            for (key, fingerprint) in keys.iter().zip(&fingerprints) {
                if queue.seen.insert(*key.flat()) || force {
                    payload.extend_from_slice(key.flat());
                    payload.extend_from_slice(fingerprint);
                    payload.extend_from_slice(result);
                    new += 1;
                }
            }
            if new == 0 {
                return Ok(0);
            }
            // A frame: payload length, crc32 of the payload, sequence number, payload.
            queue.seq += 1;
            let seq = queue.seq;
            queue
                .frames
                .extend_from_slice(&(payload.len() as u32).to_le_bytes());
            queue
                .frames
                .extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
            queue.frames.extend_from_slice(&seq.to_le_bytes());
            queue.frames.extend_from_slice(&payload);
            queue.waiters.push(Waiter {
                thread: thread::current(),
                done: Arc::clone(&done),
            });
            new
        };
        self.0.work.notify_one();
        while !done.load(Ordering::Acquire) {
            thread::park();
        }
        match &self.0.lock().failed {
            Some(failed) => Err(failed.clone().into()),
            None => Ok(new),
        }
    }
}

impl Handle for GroupLogHandle {
    type Lease = ();

    fn reserve(&mut self, key: &BenchKey) -> BenchResult<Option<()>> {
        let new = self.log(std::slice::from_ref(key), &[], false)?;
        Ok((new > 0).then_some(()))
    }

    fn complete(&mut self, key: &BenchKey, _lease: (), result: &[u8]) -> BenchResult<()> {
        self.log(std::slice::from_ref(key), result, true).map(drop)
    }

    fn reserve_many(&mut self, keys: &[BenchKey]) -> BenchResult<usize> {
        self.log(keys, &[], false)
    }

    fn fill(&mut self, keys: &[BenchKey], result: &[u8]) -> BenchResult<()> {
        if self.log(keys, result, false)? != keys.len() {
            return Err("grouplog: prefill of a key already stored".into());
        }
        Ok(())
    }
}
