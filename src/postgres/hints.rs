//! The pending rows this process wrote last: a holder's next write is decided on its own
//! row and sent at once under its nonce, with no read.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

use super::statement::Row;

/// Most pending rows remembered as hints; the map is emptied when full.
const MAX_HINTS: usize = 65_536;

/// The pending rows this process wrote last, by key (see [`Inner::hints`]). A key is
/// remembered by its 64-bit hash under a key of this map's own (the standard library's
/// randomly keyed hasher), not by its bytes: no copy of the key per hint. Two keys with one
/// hash would only make a wrong guess, which the write's compare on the row's nonce (unique
/// to each write) turns into a read, as for any stale hint.
pub(crate) struct Hints {
    rows: HashMap<u64, Row, BuildHasherDefault<Hashed>>,
    hasher: RandomState,
}

/// The map's hasher: its keys are already hashes.
#[derive(Default)]
pub(crate) struct Hashed(u64);

impl Hasher for Hashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 << 8) | u64::from(*byte);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

impl Hints {
    pub(crate) fn new() -> Hints {
        Hints {
            rows: HashMap::default(),
            hasher: RandomState::new(),
        }
    }

    fn of(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    pub(crate) fn get(&self, key: &[u8]) -> Option<&Row> {
        if self.rows.is_empty() {
            return None;
        }
        self.rows.get(&self.of(key))
    }

    pub(crate) fn remove(&mut self, key: &[u8]) -> Option<Row> {
        if self.rows.is_empty() {
            return None;
        }
        let hash = self.of(key);
        self.rows.remove(&hash)
    }

    /// Keeps (or drops) the hint of a key: the pending row this process wrote (see
    /// [`Inner::note`]).
    pub(crate) fn note(&mut self, key: &[u8], row: Option<&Row>) {
        match row.filter(|row| row.record.lease_until().is_some()) {
            Some(row) => self.keep(key, row.clone()),
            None => {
                self.remove(key);
            }
        }
    }

    /// [`note`](Hints::note) of a row the caller no longer needs: a pending row is moved in.
    pub(crate) fn note_owned(&mut self, key: &[u8], row: Row) {
        if row.record.lease_until().is_some() {
            self.keep(key, row);
        } else {
            self.remove(key);
        }
    }

    fn keep(&mut self, key: &[u8], row: Row) {
        if self.rows.len() >= MAX_HINTS {
            self.rows.clear();
        }
        let hash = self.of(key);
        self.rows.insert(hash, row);
    }
}
