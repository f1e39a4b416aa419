//! A simulated disk for crash and fault tests: it keeps what was written apart from what was
//! synced, so a test can take the image a process crash or a power loss would leave, it can
//! fail the N-th write or sync, and it can run out of space. Used as both the redb
//! `StorageBackend` and the log file, by the unit tests and by the fuzz targets
//! ([`crate::support::fuzz`]).
//!
//! The power-loss model: bytes synced by `sync_data` survive; each write since the last sync is
//! independently lost, kept, or torn (each 512-byte sector of it kept or lost on its own), in
//! any combination, and the file length is either the synced one or the live one. A process
//! crash keeps every write (the operating system holds them).

use std::fmt;
use std::io;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use idemstore::LogFile;

/// Sector size for torn writes: a power loss keeps or loses each sector of a write on its own.
const SECTOR: usize = 512;

#[derive(Default)]
struct DiskState {
    /// What reads see.
    live: Vec<u8>,
    /// What survives a power loss without any unsynced write.
    durable: Vec<u8>,
    /// Writes since the last sync, in order.
    unsynced: Vec<(u64, Vec<u8>)>,
    /// After `freeze`, writes and syncs are accepted and dropped (the process is "dead").
    frozen: bool,
    /// Counts down on every write and sync; the one that reaches zero fails, and so does every
    /// later one (a failed device stays failed).
    fail_in: Option<u64>,
    /// A full disk: a write or `set_len` that would grow the file past this many bytes fails
    /// with [`io::ErrorKind::StorageFull`] and changes nothing.
    size_limit: Option<u64>,
    writes: u64,
    syncs: u64,
    /// Syncs wait (without completing) until released: frames pile up unsynced.
    syncs_held: bool,
    /// Syncs waiting at the gate now.
    syncs_waiting: usize,
}

#[derive(Default)]
struct Shared {
    state: Mutex<DiskState>,
    /// Signalled when held syncs are released.
    released: Condvar,
}

/// A simulated disk. Clones share the same bytes.
#[derive(Clone, Default)]
pub(crate) struct SimDisk(Arc<Shared>);

/// What a power loss does to one unsynced write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    Lost,
    Kept,
    /// Each 512-byte sector kept or lost on its own.
    Torn,
}

impl fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.0.state.lock();
        write!(
            f,
            "SimDisk({} bytes live, {} unsynced writes)",
            state.live.len(),
            state.unsynced.len()
        )
    }
}

/// A tiny deterministic generator for crash choices.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

impl SimDisk {
    pub(crate) fn new() -> SimDisk {
        SimDisk::default()
    }

    /// A disk holding `image`, all of it synced.
    pub(crate) fn from_image(image: Vec<u8>) -> SimDisk {
        SimDisk(Arc::new(Shared {
            state: Mutex::new(DiskState {
                live: image.clone(),
                durable: image,
                ..DiskState::default()
            }),
            released: Condvar::new(),
        }))
    }

    /// From now on writes and syncs are dropped, as if the process had died.
    pub(crate) fn freeze(&self) {
        self.0.state.lock().frozen = true;
    }

    /// The `n`-th write or sync from now (1 = the next) fails, and every later one too.
    pub(crate) fn fail_after(&self, n: u64) {
        self.0.state.lock().fail_in = Some(n);
    }

    /// Makes the disk full at `limit` bytes (`None`: unlimited): a write or `set_len` that
    /// would grow the file past it fails with [`io::ErrorKind::StorageFull`], like `ENOSPC`.
    /// Writes inside the current length still succeed. Unlike [`fail_after`](Self::fail_after)
    /// the condition is not latched: raising the limit makes writes succeed again.
    pub(crate) fn set_size_limit(&self, limit: Option<u64>) {
        self.0.state.lock().size_limit = limit;
    }

    /// How many writes and syncs the disk has accepted (each one a distinct crash point).
    #[cfg(test)]
    pub(crate) fn io_count(&self) -> u64 {
        let state = self.0.state.lock();
        state.writes + state.syncs
    }

    /// What a process crash leaves: every write the process made (the OS has it).
    pub(crate) fn after_process_crash(&self) -> SimDisk {
        SimDisk::from_image(self.0.state.lock().live.clone())
    }

    /// What a power loss leaves: the synced bytes, then each unsynced write dropped, applied,
    /// or torn sector by sector, and the length either the synced or the live one.
    pub(crate) fn after_power_loss(&self, rng: &mut Rng) -> SimDisk {
        let fates: Vec<Fate> = (0..self.unsynced_writes())
            .map(|_| match rng.next() % 3 {
                0 => Fate::Lost,
                1 => Fate::Kept,
                _ => Fate::Torn,
            })
            .collect();
        let live_len = rng.next().is_multiple_of(2);
        self.after_power_loss_with(&fates, live_len, rng)
    }

    /// A power loss with each unsynced write's fate chosen (in write order; missing ones are
    /// lost), the length the live one or the synced one, and torn sectors drawn from `rng`.
    pub(crate) fn after_power_loss_with(
        &self,
        fates: &[Fate],
        live_len: bool,
        rng: &mut Rng,
    ) -> SimDisk {
        let state = self.0.state.lock();
        let mut image = state.durable.clone();
        for (i, (offset, data)) in state.unsynced.iter().enumerate() {
            let offset = *offset as usize;
            match fates.get(i).copied().unwrap_or(Fate::Lost) {
                Fate::Lost => {}
                Fate::Kept => apply(&mut image, offset, data),
                Fate::Torn => {
                    for (i, sector) in data.chunks(SECTOR).enumerate() {
                        if rng.next().is_multiple_of(2) {
                            apply(&mut image, offset + i * SECTOR, sector);
                        }
                    }
                }
            }
        }
        let len = if live_len {
            state.live.len()
        } else {
            state.durable.len()
        };
        image.resize(len, 0);
        SimDisk::from_image(image)
    }

    /// How many writes since the last sync.
    pub(crate) fn unsynced_writes(&self) -> usize {
        self.0.state.lock().unsynced.len()
    }

    /// From now on a sync waits until [`release_syncs`](Self::release_syncs): writes pile up
    /// unsynced, as while a slow fdatasync runs.
    #[cfg(test)]
    pub(crate) fn hold_syncs(&self) {
        self.0.state.lock().syncs_held = true;
    }

    /// Lets held syncs complete.
    #[cfg(test)]
    pub(crate) fn release_syncs(&self) {
        self.0.state.lock().syncs_held = false;
        self.0.released.notify_all();
    }

    /// A guard that lets held syncs go when dropped: a test that holds syncs declares it
    /// before its assertions, so a failed one unwinds into a failure instead of a hang (the
    /// store's threads, or a scope's, wait in the held sync forever otherwise).
    #[cfg(test)]
    pub(crate) fn release_syncs_on_drop(&self) -> ReleaseSyncs {
        ReleaseSyncs(self.clone())
    }

    /// How many syncs are waiting at the gate of [`hold_syncs`](Self::hold_syncs).
    #[cfg(test)]
    pub(crate) fn syncs_waiting(&self) -> usize {
        self.0.state.lock().syncs_waiting
    }

    /// Flips one bit of what is on the disk (live and durable alike).
    #[cfg(test)]
    pub(crate) fn flip_bit(&self, offset: usize, bit: u8) {
        let mut state = self.0.state.lock();
        state.live[offset] ^= 1 << bit;
        if offset < state.durable.len() {
            state.durable[offset] ^= 1 << bit;
        }
    }

    /// The live bytes.
    pub(crate) fn bytes(&self) -> Vec<u8> {
        self.0.state.lock().live.clone()
    }

    fn countdown(state: &mut DiskState, what: &str) -> io::Result<()> {
        if let Some(n) = state.fail_in.as_mut() {
            if *n <= 1 {
                *n = 0;
                return Err(io::Error::other(format!("injected {what} failure")));
            }
            *n -= 1;
        }
        Ok(())
    }

    /// Refuses to grow the file past the size limit.
    fn check_room(state: &DiskState, new_len: u64) -> io::Result<()> {
        match state.size_limit {
            Some(limit) if new_len > limit && new_len > state.live.len() as u64 => {
                Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    format!("no space left on the simulated disk (limit {limit} bytes, the file would grow to {new_len})"),
                ))
            }
            _ => Ok(()),
        }
    }

    fn do_write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut state = self.0.state.lock();
        Self::countdown(&mut state, "write")?;
        Self::check_room(&state, offset + data.len() as u64)?;
        state.writes += 1;
        if state.frozen {
            return Ok(());
        }
        apply(&mut state.live, offset as usize, data);
        state.unsynced.push((offset, data.to_vec()));
        Ok(())
    }

    fn do_sync(&self) -> io::Result<()> {
        let mut state = self.0.state.lock();
        if state.syncs_held {
            // What the sync will cover is what was written before it started.
            let snapshot = state.live.clone();
            let covered = state.unsynced.len();
            state.syncs_waiting += 1;
            while state.syncs_held {
                self.0.released.wait(&mut state);
            }
            state.syncs_waiting -= 1;
            Self::countdown(&mut state, "sync")?;
            state.syncs += 1;
            if state.frozen {
                return Ok(());
            }
            let synced: Vec<_> = state.unsynced.drain(..covered).collect();
            for (offset, data) in synced {
                let offset = offset as usize;
                let end = offset + data.len();
                if state.durable.len() < end {
                    state.durable.resize(end, 0);
                }
                state.durable[offset..end].copy_from_slice(&snapshot[offset..end]);
            }
            return Ok(());
        }
        Self::countdown(&mut state, "sync")?;
        state.syncs += 1;
        if state.frozen {
            return Ok(());
        }
        state.durable = state.live.clone();
        state.unsynced.clear();
        Ok(())
    }

    fn do_read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let state = self.0.state.lock();
        let start = offset as usize;
        let end = start + out.len();
        if end > state.live.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end",
            ));
        }
        out.copy_from_slice(&state.live[start..end]);
        Ok(())
    }

    fn do_set_len(&self, len: u64) -> io::Result<()> {
        let mut state = self.0.state.lock();
        Self::countdown(&mut state, "set_len")?;
        Self::check_room(&state, len)?;
        if state.frozen {
            return Ok(());
        }
        state.live.resize(len as usize, 0);
        Ok(())
    }
}

fn apply(image: &mut Vec<u8>, offset: usize, data: &[u8]) {
    if image.len() < offset + data.len() {
        image.resize(offset + data.len(), 0);
    }
    image[offset..offset + data.len()].copy_from_slice(data);
}

impl idemstore::redb::StorageBackend for SimDisk {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.state.lock().live.len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.do_read(offset, out)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.do_set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.do_sync()
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.do_write(offset, data)
    }
}

impl LogFile for SimDisk {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.state.lock().live.len() as u64)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.do_read(offset, buf)
    }
    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.do_write(offset, data)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.do_sync()
    }
}

/// Lets a disk's held syncs go when dropped ([`SimDisk::release_syncs_on_drop`]).
#[cfg(test)]
pub(crate) struct ReleaseSyncs(SimDisk);

#[cfg(test)]
impl Drop for ReleaseSyncs {
    fn drop(&mut self) {
        self.0.release_syncs();
    }
}
