//! Each window's filter ([`Filter`]): a blocked Bloom filter of the keys its table holds, in
//! parts that double as the window grows, kept in memory by every insert and saved in
//! `idemstore.filters` by every durable commit; and a key's [`Probe`], computed once and
//! tested against every window's filter.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The version byte of a saved filter's row: `2`, probes from [`FILTER_HASH`]. A version-1 row
/// (probes from foldhash) is never read, so a store left with one by an earlier build has that
/// window's filter built from its keys, and an earlier build reads a version-2 row as damaged.
const ROW_VERSION: u8 = 2;

/// Bits per key a filter is sized for: with [`PROBES`] bits per key, few absent keys pass a
/// full part's test; a new window's filter is sized a quarter above the largest window, so a
/// lookup of an absent key rarely reads a page.
const BITS_PER_KEY: usize = 16;
/// Bits set per key, all in one 512-bit block (one cache line).
const PROBES: u64 = 11;
/// The smallest filter part, in keys.
pub(crate) const MIN_CAPACITY: usize = 1024;
/// Parts a filter grows to: each twice the last; a window that outgrows them all reads as
/// "may hold" for every key (correct, only slower).
const PARTS: usize = 12;

/// The bits a key sets in its block, and what picks the block: computed once per key and
/// tested against every window's filter.
#[derive(Clone, Copy)]
pub(crate) struct Probe {
    block: u64,
    bits: [u64; 8],
}

impl Probe {
    /// The probe of the key whose hash is `hash` ([`Windows::hash`]).
    #[inline]
    pub(crate) fn of(hash: u64) -> Probe {
        // Double hashing inside the block: PROBES positions from two 9-bit values.
        let mixed = hash.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let first = mixed >> 55;
        let step = ((mixed >> 46) & 511) | 1;
        let mut bits = [0u64; 8];
        for i in 0..PROBES {
            let bit = (first + i * step) & 511;
            bits[(bit / 64) as usize] |= 1 << (bit % 64);
        }
        Probe {
            block: hash >> 32,
            bits,
        }
    }
}

/// The keys of one window, approximately: [`may_hold`](Filter::may_hold) never answers no
/// for a key that was inserted. It grows by parts, each twice the size of the last, when a
/// window takes more keys than its filter was made for. Shared by the writer, which inserts,
/// and readers, without a lock.
pub(crate) struct Filter {
    parts: [OnceLock<Bloom>; PARTS],
    /// Parts in use.
    used: AtomicUsize,
    /// Holds every key (a window a read snapshot holds that has no filter any more).
    everything: bool,
    first_capacity: usize,
    /// Whether `idemstore.filters` holds this filter as it is (in the state committed last,
    /// durable or not): cleared, and the row deleted, by the first insert after it was saved.
    pub(crate) saved: AtomicBool,
    /// Whether a record left the window since the last look at whether it is empty
    /// (`Tables::drop_ended_windows`, which deletes an empty window's table).
    pub(crate) shrunk: AtomicBool,
    /// Whether a record was written to the window narrower than its horizon's since the last
    /// merge looked at it (`Tables::merge_closed_windows`, which moves such records into their
    /// horizon's window).
    pub(crate) unmerged: AtomicBool,
}

impl Filter {
    pub(crate) fn with_capacity(keys: usize) -> Filter {
        let filter = Filter {
            parts: Default::default(),
            used: AtomicUsize::new(0),
            everything: false,
            first_capacity: keys.max(MIN_CAPACITY),
            saved: AtomicBool::new(false),
            shrunk: AtomicBool::new(false),
            unmerged: AtomicBool::new(false),
        };
        let _ = filter.parts[0].set(Bloom::new(filter.first_capacity));
        filter.used.store(1, Ordering::Release);
        filter
    }

    pub(crate) fn everything() -> Filter {
        Filter {
            parts: Default::default(),
            used: AtomicUsize::new(0),
            everything: true,
            first_capacity: MIN_CAPACITY,
            saved: AtomicBool::new(false),
            shrunk: AtomicBool::new(false),
            unmerged: AtomicBool::new(false),
        }
    }

    /// The filter's bytes in `idemstore.filters`: a version byte ([`ROW_VERSION`]) and the
    /// number of parts, then for each part its capacity, the keys inserted and the number of
    /// 512-bit blocks (u64 LE each), and its words (u64 LE); last, the CRC-32 of every byte
    /// before it (u32 LE), so a row changed in place is not read.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let used = self.used.load(Ordering::Acquire);
        let parts: Vec<&Bloom> = self.parts[..used].iter().filter_map(|p| p.get()).collect();
        let mut out =
            Vec::with_capacity(2 + parts.iter().map(|b| 24 + b.words.len() * 8).sum::<usize>() + 4);
        out.push(ROW_VERSION);
        out.push(parts.len() as u8);
        for bloom in parts {
            out.extend_from_slice(&(bloom.capacity as u64).to_le_bytes());
            out.extend_from_slice(&(bloom.inserted.load(Ordering::Relaxed) as u64).to_le_bytes());
            out.extend_from_slice(&bloom.blocks.to_le_bytes());
            for word in bloom.words.iter() {
                out.extend_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
            }
        }
        let sum = crc32fast::hash(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// A filter from [`encode`](Filter::encode)'s bytes, saved; `None` for bytes that are not
    /// one as [`insert`](Filter::insert) makes them (the window's filter is then built from its
    /// keys). Each part is checked before its words are allocated: the first holds at least
    /// [`MIN_CAPACITY`] keys and each next one twice the last's; each has the blocks its
    /// capacity takes; every part but the last is full, and the last holds at most its
    /// capacity (twice it for the last of [`PARTS`], which takes every key past them); and the
    /// words are exactly the rest of the row. So nothing overflows, and what is allocated is
    /// bounded by the row's own length. A row whose CRC-32 does not match is refused first.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Filter> {
        let (bytes, sum) = bytes.split_last_chunk::<4>()?;
        if crc32fast::hash(bytes) != u32::from_le_bytes(*sum) {
            return None;
        }
        let (&[version, count], mut rest) = bytes.split_first_chunk::<2>()?;
        let count = usize::from(count);
        if version != ROW_VERSION || count == 0 || count > PARTS {
            return None;
        }
        let u64_at = |rest: &mut &[u8]| -> Option<u64> {
            let (word, tail) = rest.split_first_chunk::<8>()?;
            *rest = tail;
            Some(u64::from_le_bytes(*word))
        };
        let mut filter = Filter {
            parts: Default::default(),
            used: AtomicUsize::new(0),
            everything: false,
            first_capacity: MIN_CAPACITY,
            saved: AtomicBool::new(true),
            shrunk: AtomicBool::new(false),
            unmerged: AtomicBool::new(false),
        };
        let mut previous: Option<usize> = None;
        for i in 0..count {
            let capacity = usize::try_from(u64_at(&mut rest)?).ok()?;
            let inserted = usize::try_from(u64_at(&mut rest)?).ok()?;
            let blocks = u64_at(&mut rest)?;
            match previous {
                None if capacity < MIN_CAPACITY => return None,
                None => filter.first_capacity = capacity,
                Some(last) if Some(capacity) != last.checked_mul(2) => return None,
                Some(_) => {}
            }
            previous = Some(capacity);
            if Some(blocks) != blocks_for(capacity) {
                return None;
            }
            let full = if i + 1 == PARTS {
                capacity.checked_mul(2)?
            } else {
                capacity
            };
            if inserted > full || (i + 1 < count && inserted != capacity) {
                return None;
            }
            let words = usize::try_from(blocks).ok()?.checked_mul(8)?;
            if rest.len() < words.checked_mul(8)? {
                return None;
            }
            let bloom = Bloom {
                words: (0..words)
                    .map(|_| AtomicU64::new(u64_at(&mut rest).unwrap_or(0)))
                    .collect(),
                blocks,
                capacity,
                inserted: AtomicUsize::new(inserted),
            };
            let _ = filter.parts[i].set(bloom);
        }
        if !rest.is_empty() {
            return None;
        }
        filter.used.store(count, Ordering::Release);
        Some(filter)
    }

    /// Parts in use: one, and one more each time the last filled up.
    #[cfg(feature = "__whitebox")]
    pub(crate) fn parts_used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Keys inserted (each insert counts, so a key inserted twice counts twice).
    pub(crate) fn len(&self) -> usize {
        self.parts
            .iter()
            .filter_map(|p| p.get())
            .map(|b| b.inserted.load(Ordering::Relaxed))
            .sum()
    }

    /// Adds the key whose hash is `hash`. Called by one writer at a time (inside redb's write
    /// transaction).
    pub(crate) fn insert(&self, hash: u64) {
        self.insert_probe(&Probe::of(hash));
    }

    /// [`insert`](Filter::insert) of a key whose probe is known.
    pub(crate) fn insert_probe(&self, probe: &Probe) {
        if self.everything {
            return;
        }
        let used = self.used.load(Ordering::Acquire);
        let last = &self.parts[used - 1];
        let bloom = last.get().expect("a used part is set");
        if bloom.inserted.load(Ordering::Relaxed) < bloom.capacity || used == PARTS {
            bloom.insert(probe);
            return;
        }
        let next = Bloom::new(bloom.capacity.saturating_mul(2));
        next.insert(probe);
        let _ = self.parts[used].set(next);
        self.used.store(used + 1, Ordering::Release);
    }

    /// Whether the key of `probe` may have been inserted.
    #[inline]
    pub(crate) fn may_hold(&self, probe: &Probe) -> bool {
        if self.everything {
            return true;
        }
        let used = self.used.load(Ordering::Acquire);
        self.parts[..used]
            .iter()
            .any(|p| p.get().is_some_and(|b| b.may_hold(probe)))
    }
}

/// One part of a [`Filter`]: 512-bit blocks, [`PROBES`] bits per key in the block its hash
/// picks.
struct Bloom {
    words: Box<[AtomicU64]>,
    blocks: u64,
    capacity: usize,
    inserted: AtomicUsize,
}

/// The 512-bit blocks of a part of `capacity` keys ([`BITS_PER_KEY`] each); `None` past `u64`.
fn blocks_for(capacity: usize) -> Option<u64> {
    let bits = u64::try_from(capacity)
        .ok()?
        .checked_mul(BITS_PER_KEY as u64)?;
    Some(bits.div_ceil(512).max(1))
}

impl Bloom {
    fn new(capacity: usize) -> Bloom {
        let blocks = blocks_for(capacity).expect("a filter part made in memory is addressable");
        Bloom {
            words: (0..blocks * 8).map(|_| AtomicU64::new(0)).collect(),
            blocks,
            capacity,
            inserted: AtomicUsize::new(0),
        }
    }

    /// The first word of the block `probe` picks.
    #[inline]
    fn block(&self, probe: &Probe) -> usize {
        (((probe.block & 0xffff_ffff) * self.blocks) >> 32) as usize * 8
    }

    fn insert(&self, probe: &Probe) {
        let first = self.block(probe);
        for (i, bits) in probe.bits.iter().enumerate() {
            if *bits != 0 {
                self.words[first + i].fetch_or(*bits, Ordering::Relaxed);
            }
        }
        self.inserted.fetch_add(1, Ordering::Relaxed);
    }

    #[inline]
    fn may_hold(&self, probe: &Probe) -> bool {
        let first = self.block(probe);
        let words = &self.words[first..first + 8];
        probe
            .bits
            .iter()
            .zip(words)
            .all(|(bits, word)| word.load(Ordering::Relaxed) & bits == *bits)
    }
}
