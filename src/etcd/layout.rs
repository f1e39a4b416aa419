//! The etcd data model: which etcd keys hold a record and its index, what their values hold,
//! and how fencing tokens are made from etcd revisions. `docs/etcd.md` describes it for
//! operators.
//!
//! Under the store's prefix `P`:
//! - `P layout`: the layout version ([`LAYOUT_VERSION`]), written when a store first connects
//!   to an empty prefix; a prefix of another version is refused.
//! - `P r/<key>`: the record. Value: [`Stored`]'s envelope (version, writer nonce, record).
//! - `P i/<due, 8 bytes big-endian><nonce>`: an index entry, one per transaction that puts
//!   records, listing them (value: [`encode_entry`]). `due` is the earliest moment one of them
//!   needs looking at: a pending record's lease end, else its expiry. An entry speaks only for
//!   the records still at the revision it names; a record written again has a newer entry of
//!   its own, so older entries may name keys that moved on (or are gone): sweeping and
//!   `stale` check every record against its entry and delete spent entries.
//! - `P s/<expires_at, 8 bytes big-endian><nonce>`: the same for pending records whose lease
//!   ran out, moved there by a sweep until they expire, so `stale` finds them.
//!
//! `<key>` is [`Key`]'s own length-prefixed encoding, so keys never collide.

use crate::key::Key;
use crate::record::{Millis, Record, State};

/// The layout version written by this build: 2 has the per-transaction index (`i/`, `s/`);
/// 1 had an expiry entry and a lease entry per record (`x/`, `l/`).
pub(crate) const LAYOUT_VERSION: u8 = 2;
/// Bytes of one listed key's revision in an index entry.
const REVISION_BYTES: usize = 8;
/// The envelope layout version written by this build.
const ENVELOPE_VERSION: u8 = 1;
/// Bytes before the record: version, then the writer's nonce.
const ENVELOPE_HEADER: usize = 1 + 16;

/// A stored token with this bit set is a placeholder: the acquiring transaction did not know
/// its own revision. It reads as `mod_revision << SLOT_BITS | slot`.
const PLACEHOLDER: u64 = 1 << 63;
/// Bits of a token that number the acquisitions within one transaction (a batch).
pub(crate) const SLOT_BITS: u32 = 10;
/// Most acquisitions one transaction may make (each gets its own token).
pub(crate) const MAX_SLOTS: usize = 1 << SLOT_BITS;

/// The placeholder token for the `slot`-th acquisition of a transaction.
pub(crate) fn placeholder(slot: usize) -> u64 {
    debug_assert!(slot < MAX_SLOTS);
    PLACEHOLDER | slot as u64
}

/// The real token of a placeholder written in the transaction of `revision`; other tokens are
/// returned unchanged.
pub(crate) fn resolve_token(token: u64, revision: i64) -> u64 {
    if token & PLACEHOLDER == 0 {
        return token;
    }
    let slot = token & (MAX_SLOTS as u64 - 1);
    (u64::try_from(revision).unwrap_or(0) << SLOT_BITS) | slot
}

/// Who wrote a value: a random id of the `EtcdStore` and a counter of its writes. After an
/// ambiguous answer, finding its own nonce in the key tells a writer that its write landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Nonce {
    pub(crate) store: u64,
    pub(crate) write: u64,
}

/// The etcd keys of one store (one prefix).
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    prefix: Vec<u8>,
}

impl Layout {
    pub(crate) fn new(prefix: &[u8]) -> Layout {
        Layout {
            prefix: prefix.to_vec(),
        }
    }

    fn join(&self, kind: &[u8], rest: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.prefix.len() + 2 + 8 + 3 * 256);
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(kind);
        for part in rest {
            out.extend_from_slice(part);
        }
        out
    }

    /// The etcd key of `key`'s record.
    pub(crate) fn record(&self, key: &Key) -> Vec<u8> {
        self.join(b"r/", &[key.encoded()])
    }

    /// The layout version key.
    pub(crate) fn version(&self) -> Vec<u8> {
        self.join(b"layout", &[])
    }

    /// The start of the records' range.
    pub(crate) fn records(&self) -> Vec<u8> {
        self.join(b"r/", &[])
    }

    /// The end of the records' range (exclusive).
    pub(crate) fn records_end(&self) -> Vec<u8> {
        self.join(b"r0", &[])
    }

    /// The prefix.
    pub(crate) fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// A new index entry due at `due`, unique by the writer's nonce; `stale` puts it in the
    /// range of ran-out leases.
    pub(crate) fn entry(&self, due: Millis, nonce: Nonce, stale: bool) -> Vec<u8> {
        let kind: &[u8] = if stale { b"s/" } else { b"i/" };
        self.join(
            kind,
            &[
                &due.to_be_bytes(),
                &nonce.store.to_be_bytes(),
                &nonce.write.to_be_bytes(),
            ],
        )
    }

    /// The range `[start, end)` of index entries due at or before `now` (`stale`: of ran-out
    /// leases).
    pub(crate) fn due_range(&self, now: Millis, stale: bool) -> (Vec<u8>, Vec<u8>) {
        let kind: &[u8] = if stale { b"s/" } else { b"i/" };
        (
            self.join(kind, &[]),
            self.join(kind, &[&now.saturating_add(1).to_be_bytes()]),
        )
    }

    /// The whole range `[start, end)` of entries of ran-out leases.
    pub(crate) fn stale_range(&self) -> (Vec<u8>, Vec<u8>) {
        (self.join(b"s/", &[]), self.join(b"s0", &[]))
    }

    /// When the index entry `entry` is due, if it is one of this layout's.
    pub(crate) fn due_of(&self, entry: &[u8]) -> Option<Millis> {
        let rest = entry.strip_prefix(self.prefix.as_slice())?;
        let rest = rest
            .strip_prefix(b"i/".as_slice())
            .or_else(|| rest.strip_prefix(b"s/".as_slice()))?;
        Some(Millis::from_be_bytes(rest.get(..8)?.try_into().ok()?))
    }
}

/// When a record needs looking at: a pending record when its lease runs out, any other when
/// it expires; `None` for one that never expires and is not pending (under review).
pub(crate) fn due(record: &Record) -> Option<Millis> {
    match record.state {
        State::Pending { lease_until, .. } => Some(lease_until),
        _ => (record.expires_at != Millis::MAX).then_some(record.expires_at),
    }
}

/// One key named by an index entry, at the revision of the record it speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    pub(crate) key: Key,
    /// The record's `mod_revision`; 0 for "the revision of the entry itself" (an entry
    /// written in the same transaction as its records, which cannot know that revision).
    pub(crate) revision: i64,
}

/// An index entry's value: for each key, its encoding's length (2 bytes little-endian), the
/// encoding, and the revision (8 bytes little-endian).
pub(crate) fn encode_entry(listed: &[Listed]) -> Vec<u8> {
    let mut out = Vec::with_capacity(listed.len() * 64);
    for item in listed {
        let key = item.key.encoded();
        out.extend_from_slice(&(key.len() as u16).to_le_bytes());
        out.extend_from_slice(key);
        out.extend_from_slice(&item.revision.to_le_bytes());
    }
    out
}

/// Decodes an index entry's value. Never panics: damage is an `Err` with a reason.
pub(crate) fn decode_entry(mut value: &[u8]) -> Result<Vec<Listed>, String> {
    let mut out = Vec::new();
    while !value.is_empty() {
        let at = out.len();
        let len = value
            .get(..2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
            .ok_or_else(|| format!("item {at}: cut inside its length"))?;
        let key = value
            .get(2..2 + len)
            .and_then(Key::decode)
            .ok_or_else(|| format!("item {at}: not a key ({len} bytes)"))?;
        let revision = value
            .get(2 + len..2 + len + REVISION_BYTES)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            .ok_or_else(|| format!("item {at}: cut inside its revision"))?;
        out.push(Listed { key, revision });
        value = &value[2 + len + REVISION_BYTES..];
    }
    Ok(out)
}

/// A record as read from etcd: decoded, its token resolved, with the revisions to compare on.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) record: Record,
    pub(crate) nonce: Nonce,
    pub(crate) mod_revision: i64,
    pub(crate) create_revision: i64,
}

/// Encodes `record` with the writer's nonce.
pub(crate) fn encode(record: &Record, nonce: Nonce) -> Vec<u8> {
    let body = record.encode();
    let mut out = Vec::with_capacity(ENVELOPE_HEADER + body.len());
    out.push(ENVELOPE_VERSION);
    out.extend_from_slice(&nonce.store.to_le_bytes());
    out.extend_from_slice(&nonce.write.to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// Decodes a record value read at `mod_revision`. Never panics: damage is an `Err` with a
/// reason.
pub(crate) fn decode(
    value: &[u8],
    mod_revision: i64,
    create_revision: i64,
) -> Result<Stored, String> {
    if value.len() < ENVELOPE_HEADER {
        return Err(format!(
            "value is {} bytes, shorter than the {ENVELOPE_HEADER} byte envelope",
            value.len()
        ));
    }
    if value[0] != ENVELOPE_VERSION {
        return Err(format!(
            "envelope version {} is not supported (this build reads {ENVELOPE_VERSION})",
            value[0]
        ));
    }
    let word = |at: usize| u64::from_le_bytes(value[at..at + 8].try_into().expect("8 bytes"));
    let nonce = Nonce {
        store: word(1),
        write: word(9),
    };
    let mut record = Record::decode(&value[ENVELOPE_HEADER..])?;
    record.token = resolve_token(record.token, mod_revision);
    Ok(Stored {
        record,
        nonce,
        mod_revision,
        create_revision,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;

    fn pending(token: u64) -> Record {
        Record {
            fingerprint: Fingerprint::of(b"body"),
            token,
            attempt: 1,
            expires_at: 5_000,
            state: State::Pending {
                lease_until: 1_000,
                progress: None,
            },
        }
    }

    #[test]
    fn placeholder_tokens_resolve_to_the_revision_and_slot() {
        let nonce = Nonce { store: 7, write: 9 };
        let value = encode(&pending(placeholder(3)), nonce);
        let stored = decode(&value, 42, 40).unwrap();
        assert_eq!(stored.record.token, (42 << SLOT_BITS) | 3);
        assert_eq!(stored.nonce, nonce);
        // A resolved token is stored as it is.
        let again = decode(&encode(&stored.record, nonce), 50, 40).unwrap();
        assert_eq!(again.record.token, (42 << SLOT_BITS) | 3);
    }

    #[test]
    fn later_revisions_make_bigger_tokens_whatever_the_slot() {
        let last_of_earlier = resolve_token(placeholder(MAX_SLOTS - 1), 10);
        let first_of_later = resolve_token(placeholder(0), 11);
        assert!(first_of_later > last_of_earlier);
    }

    #[test]
    fn damaged_values_are_errors_not_panics() {
        let value = encode(&pending(1), Nonce { store: 1, write: 2 });
        for cut in 0..value.len() {
            assert!(decode(&value[..cut], 1, 1).is_err(), "cut at {cut}");
        }
        let mut flipped = value.clone();
        flipped[0] = 9;
        assert!(decode(&flipped, 1, 1).unwrap_err().contains("version 9"));
        let mut flipped = value;
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(decode(&flipped, 1, 1).unwrap_err().contains("checksum"));
    }

    #[test]
    fn index_entries_sort_by_time_and_list_their_keys() {
        let layout = Layout::new(b"app/");
        let a = Key::new("s", "o", "i").unwrap();
        let b = Key::new("s:o", "p", "i:j").unwrap();
        let nonce = Nonce { store: 3, write: 4 };
        let entry = layout.entry(5_000, nonce, false);
        assert_eq!(layout.due_of(&entry), Some(5_000));
        let (start, end) = layout.due_range(5_000, false);
        assert!(start <= entry && entry < end);
        let (_, before) = layout.due_range(4_999, false);
        assert!(entry >= before);
        let stale = layout.entry(7, nonce, true);
        let (start, end) = layout.stale_range();
        assert!(start <= stale && stale < end && !(start <= entry && entry < end));
        assert!(layout.due_of(b"app/r/xx").is_none());
        assert!(layout.version() < layout.records() || layout.version() > end);

        let listed = vec![
            Listed {
                key: a,
                revision: 0,
            },
            Listed {
                key: b,
                revision: 77,
            },
        ];
        let value = encode_entry(&listed);
        assert_eq!(decode_entry(&value).unwrap(), listed);
        for cut in 1..value.len() {
            if let Ok(decoded) = decode_entry(&value[..cut]) {
                // Only a cut between items decodes, to fewer items.
                assert!(decoded.len() < listed.len(), "cut at {cut}");
            }
        }
    }

    #[test]
    fn records_are_due_at_their_lease_end_then_their_expiry() {
        assert_eq!(due(&pending(1)), Some(1_000));
        let mut done = pending(1);
        done.state = State::Completed {
            completed_at: 2,
            result: Vec::new(),
        };
        assert_eq!(due(&done), Some(5_000));
        done.expires_at = Millis::MAX;
        assert_eq!(due(&done), None);
    }
}
