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
const MIN_CAPACITY: usize = 1024;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::windows::{FilterSeed, Windows};

    /// A saved filter reads back holding every key it held, across parts; bytes that are not
    /// a saved filter (cut short, or with anything changed in the header) are refused rather
    /// than read, so the window's filter is built from its keys instead.
    #[test]
    fn a_saved_filter_reads_back_and_damaged_bytes_are_refused() {
        let filter = Filter::with_capacity(100);
        let hashes: Vec<u64> = (0..5_000u64)
            .map(|i| crate::key::hash_of(format!("key-{i}").as_bytes()))
            .collect();
        for &hash in &hashes {
            filter.insert(hash);
        }
        assert!(
            filter.used.load(Ordering::Acquire) > 1,
            "the filter grew parts"
        );
        let bytes = filter.encode();
        let back = Filter::decode(&bytes).expect("saved bytes read back");
        assert!(back.saved.load(Ordering::Acquire));
        assert_eq!(back.len(), filter.len());
        for &hash in &hashes {
            assert!(back.may_hold(&Probe::of(hash)), "a key was lost");
        }
        for len in [0, 1, 2, 10, 25, bytes.len() - 1] {
            assert!(Filter::decode(&bytes[..len]).is_none(), "cut at {len}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Filter::decode(&longer).is_none(), "a byte too many");
        assert!(Filter::decode(&seal(&longer)).is_none(), "a word cut short");
        for at in [0, 1, 2, 40, bytes.len() / 2, bytes.len() - 1] {
            let mut changed = bytes.clone();
            changed[at] ^= 0x10;
            assert!(Filter::decode(&changed).is_none(), "byte {at} changed");
        }
        for (at, value) in [(0, 1), (0, 3), (1, 0), (1, 13)] {
            let mut changed = unsealed(&bytes);
            changed[at] = value;
            let changed = seal(&changed);
            assert!(Filter::decode(&changed).is_none(), "byte {at} = {value}");
        }
    }

    /// A row's bytes before its CRC.
    fn unsealed(row: &[u8]) -> Vec<u8> {
        row[..row.len() - 4].to_vec()
    }

    /// `bytes` with their CRC-32 after them, as [`Filter::encode`] ends a row.
    fn seal(bytes: &[u8]) -> Vec<u8> {
        let mut row = bytes.to_vec();
        row.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
        row
    }

    /// The header of part `part` of a row's bytes: (offset of its capacity, blocks).
    fn part_at(bytes: &[u8], part: usize) -> (usize, u64) {
        let mut at = 2;
        for _ in 0..part {
            let blocks = u64::from_le_bytes(bytes[at + 16..at + 24].try_into().unwrap());
            at += 24 + blocks as usize * 64;
        }
        let blocks = u64::from_le_bytes(bytes[at + 16..at + 24].try_into().unwrap());
        (at, blocks)
    }

    /// A saved row that is not what `insert` makes, though its CRC matches (written so on
    /// purpose, or by a bug), is refused before anything is allocated for it, without an
    /// overflow or a panic: the window's filter is then built from its keys. Its keys-inserted
    /// count is bounded, since a new window's filter is sized from the largest count.
    #[test]
    fn hostile_saved_filters_are_refused_before_anything_is_allocated() {
        let filter = Filter::with_capacity(MIN_CAPACITY);
        for i in 0..3_500u64 {
            filter.insert(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        }
        assert_eq!(filter.used.load(Ordering::Acquire), 3, "three parts");
        let bytes = unsealed(&filter.encode());
        assert!(Filter::decode(&seal(&bytes)).is_some(), "the row as saved");
        let put = |bytes: &mut Vec<u8>, at: usize, value: u64| {
            bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        };
        let (first, _) = part_at(&bytes, 0);
        let (second, _) = part_at(&bytes, 1);
        let (last, _) = part_at(&bytes, 2);
        let cases: Vec<(&str, usize, u64)> = vec![
            (
                "the last part's count past its capacity",
                last + 8,
                4 * 1024 + 1,
            ),
            ("the last part's count at u64::MAX", last + 8, u64::MAX),
            ("a huge count (2^40)", last + 8, 1 << 40),
            ("a part before the last not full", second + 8, 2 * 1024 - 1),
            ("a part before the last over full", first + 8, 1024 + 1),
            (
                "the first part under the smallest",
                first,
                MIN_CAPACITY as u64 / 2,
            ),
            ("a part not twice the last", second, 3 * 1024),
            ("a capacity at u64::MAX", last, u64::MAX),
            ("blocks not the capacity's", first + 16, 33),
            ("blocks of 2^40, past the row", first + 16, 1 << 40),
            ("blocks at u64::MAX", first + 16, u64::MAX),
        ];
        for (what, at, value) in cases {
            let mut changed = bytes.clone();
            put(&mut changed, at, value);
            assert!(Filter::decode(&seal(&changed)).is_none(), "{what}");
        }
        // The same with the row's other fields made to agree (the claimed blocks of a huge
        // capacity): the words must be in the row, so nothing is allocated for them.
        let mut huge = bytes[..2].to_vec();
        huge[1] = 1;
        for value in [1u64 << 40, 0, (1u64 << 40) * 16 / 512] {
            huge.extend_from_slice(&value.to_le_bytes());
        }
        assert!(
            Filter::decode(&seal(&huge)).is_none(),
            "a part past the row"
        );
    }

    /// The filters' hash is SipHash-1-3 of the key's bytes under the store's seed, pinned to
    /// known answers: the first two from siphasher's own vectors of the published algorithm
    /// (key 00..0f; the empty message and 00..0e), all three checked against a separate
    /// implementation of the reference code. A build whose hash gave other answers would read
    /// saved filters as missing their keys.
    #[test]
    fn the_filter_hash_is_siphash_1_3_of_the_bytes_under_the_seed() {
        let seed = FilterSeed(0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908);
        let windows = Windows::seeded(seed);
        let key = b"\x06tenant\x06charge\x074f0c-a1";
        assert_eq!(windows.hash(b""), 0xabac_0158_050f_c4dc);
        let message: Vec<u8> = (0..15).collect();
        assert_eq!(windows.hash(&message), 0xd320_d86d_2a51_9956);
        assert_eq!(windows.hash(key), 0x76f2_e262_19a0_c28d);
        assert_eq!(
            Windows::new().hash(key),
            0xef38_fade_2e2a_d016,
            "the all-zero seed"
        );
        let other = Windows::seeded(FilterSeed(seed.0 ^ 1, seed.1));
        assert_ne!(other.hash(key), windows.hash(key), "the seed keys the hash");
    }
}
