//! The etcd data model: which etcd keys hold a record and its two indexes, what their values
//! hold, and how fencing tokens are made from etcd revisions. `docs/etcd.md` describes it for
//! operators.
//!
//! Under the store's prefix `P`:
//! - `P r/<key>`: the record. Value: [`Stored`]'s envelope (version, writer nonce, record).
//! - `P x/<expires_at, 8 bytes big-endian><key>`: the expiry index (empty value), for every
//!   record that can expire, so a sweep reads expired keys in time order.
//! - `P l/<lease_until, 8 bytes big-endian><key>`: the lease index (empty value), for every
//!   pending record, so `stale` lists leases that ran out, oldest first.
//!
//! `<key>` is [`Key`]'s own length-prefixed encoding, so keys never collide.

use crate::key::Key;
use crate::record::{Millis, Record, State};

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

impl Nonce {
    /// A nonce for sizing a write that is never sent.
    pub(crate) const ZERO: Nonce = Nonce { store: 0, write: 0 };
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

    /// The expiry index entry of a record, if it can expire.
    pub(crate) fn expiry(&self, key: &Key, record: &Record) -> Option<Vec<u8>> {
        (record.expires_at != Millis::MAX)
            .then(|| self.join(b"x/", &[&record.expires_at.to_be_bytes(), key.encoded()]))
    }

    /// The lease index entry of a record, if it is pending.
    pub(crate) fn lease(&self, key: &Key, record: &Record) -> Option<Vec<u8>> {
        match record.state {
            State::Pending { lease_until, .. } => {
                Some(self.join(b"l/", &[&lease_until.to_be_bytes(), key.encoded()]))
            }
            _ => None,
        }
    }

    /// The range `[start, end)` of expiry index entries with `expires_at <= now`.
    pub(crate) fn expired_range(&self, now: Millis) -> (Vec<u8>, Vec<u8>) {
        (
            self.join(b"x/", &[]),
            self.join(b"x/", &[&now.saturating_add(1).to_be_bytes()]),
        )
    }

    /// The range `[start, end)` of lease index entries with `lease_until <= now`.
    pub(crate) fn ran_out_range(&self, now: Millis) -> (Vec<u8>, Vec<u8>) {
        (
            self.join(b"l/", &[]),
            self.join(b"l/", &[&now.saturating_add(1).to_be_bytes()]),
        )
    }

    /// The key named by an index entry (`x/` or `l/`), if it is one of this layout's.
    pub(crate) fn key_of_index(&self, entry: &[u8]) -> Option<Key> {
        let rest = entry.strip_prefix(self.prefix.as_slice())?;
        let rest = rest
            .strip_prefix(b"x/".as_slice())
            .or_else(|| rest.strip_prefix(b"l/".as_slice()))?;
        Key::decode(rest.get(8..)?)
    }
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
    fn index_entries_name_their_key_and_sort_by_time() {
        let layout = Layout::new(b"app/");
        let key = Key::new("s", "o", "i").unwrap();
        let record = pending(1);
        let expiry = layout.expiry(&key, &record).unwrap();
        let lease = layout.lease(&key, &record).unwrap();
        assert_eq!(layout.key_of_index(&expiry), Some(key.clone()));
        assert_eq!(layout.key_of_index(&lease), Some(key.clone()));
        let (start, end) = layout.expired_range(5_000);
        assert!(start <= expiry && expiry < end);
        let (_, before) = layout.expired_range(4_999);
        assert!(expiry >= before);
        assert!(layout.key_of_index(b"app/r/xx").is_none());
    }
}
