//! Log frames: one frame per committed batch.
//!
//! ```text
//! frame   = header payload padding
//! header  = payload_len u32 | seq u64 | durable u64 | payload_crc u32 | header_crc u32
//!           (28 bytes, LE)
//! payload = next_token u64 | count u32 | entry*count
//! entry   = kind u8 (1 put, 2 delete) | key_len u16 | key | [record_len u32 | record]  (put only)
//! padding = zero bytes up to the next multiple of 8
//! ```
//! `durable` is the highest sequence number known durable (synced) when the frame was written:
//! recovery uses it to tell an unacknowledged torn tail from a lost acknowledged frame.
//! `header_crc` is the CRC-32 of the log's current salt (8 bytes, little-endian) followed by the
//! first 24 header bytes; `payload_crc` covers the payload. The salt is a random number that
//! changes at every checkpoint and is kept in the store's meta table, so a frame written
//! before the last rewind, or bytes shaped like a frame inside a stored result, never pass as a
//! current frame: only the store knows the salt. Entries are
//! after-images (the record as stored, or its deletion), so replaying a frame twice leaves the
//! same state. Decoding never panics and never allocates more than the bytes it was given.

use crate::error::Error;

/// Size of a frame header in bytes.
pub const HEADER_LEN: usize = 28;
/// Frames start at multiples of this many bytes.
pub const ALIGN: usize = 8;

const KIND_PUT: u8 = 1;
const KIND_DELETE: u8 = 2;

/// One decoded change: the key and its new encoded record, or `None` for a deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key, encoded.
    pub key: Vec<u8>,
    /// The new encoded record; `None` deletes the key.
    pub record: Option<Vec<u8>>,
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The frame's sequence number.
    pub seq: u64,
    /// The highest sequence number known durable when the frame was written.
    pub durable: u64,
    /// The next fencing token once this frame is applied.
    pub next_token: u64,
    /// The changes, in order.
    pub entries: Vec<Entry>,
}

/// A parsed, checksum-valid frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The payload's length in bytes, padding excluded.
    pub payload_len: usize,
    /// The frame's sequence number.
    pub seq: u64,
    /// The highest sequence number known durable when the frame was written.
    pub durable: u64,
    /// The payload's checksum.
    pub payload_crc: u32,
}

impl Header {
    /// The whole frame's length, padding included.
    pub fn frame_len(&self) -> usize {
        padded(HEADER_LEN + self.payload_len)
    }
}

/// `len` rounded up to the frame alignment.
pub fn padded(len: usize) -> usize {
    len.div_ceil(ALIGN) * ALIGN
}

/// Appends the encoding of a frame to `out` (which must start at an aligned length).
/// Each entry is a key and its new encoded record, or `None` for a deletion.
pub fn encode<'a>(
    max_payload: usize,
    salt: u64,
    seq: u64,
    durable: u64,
    next_token: u64,
    entries: impl ExactSizeIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    out: &mut Vec<u8>,
) {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_LEN]);
    out.extend_from_slice(&next_token.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for (key, record) in entries {
        let key_len = u16::try_from(key.len()).expect("encoded keys are at most 768 bytes");
        out.push(if record.is_some() {
            KIND_PUT
        } else {
            KIND_DELETE
        });
        out.extend_from_slice(&key_len.to_le_bytes());
        out.extend_from_slice(key);
        if let Some(record) = record {
            let len = u32::try_from(record.len()).expect("records are below 4 GiB");
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(record);
        }
    }
    let payload_len = out.len() - start - HEADER_LEN;
    // Unreachable by input: a batch holds at most 64 MiB of entries or one request part of one
    // operation (a result is at most 256 MiB), far below the u32 length field's limit.
    assert!(
        payload_len <= max_payload,
        "a frame of {payload_len} bytes is over the format's limit of {max_payload}"
    );
    let payload_crc = crc32fast::hash(&out[start + HEADER_LEN..]);
    let header = &mut out[start..start + HEADER_LEN];
    header[0..4].copy_from_slice(
        &u32::try_from(payload_len)
            .expect("a batch frame is below 4 GiB")
            .to_le_bytes(),
    );
    header[4..12].copy_from_slice(&seq.to_le_bytes());
    header[12..20].copy_from_slice(&durable.to_le_bytes());
    header[20..24].copy_from_slice(&payload_crc.to_le_bytes());
    let header_crc = header_crc(salt, &header[..24]);
    header[24..28].copy_from_slice(&header_crc.to_le_bytes());
    out.resize(start + padded(out.len() - start), 0);
}

/// The checksum of a header's fields, seeded with the log's salt.
pub fn header_crc(salt: u64, fields: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&salt.to_le_bytes());
    hasher.update(fields);
    hasher.finalize()
}

/// Parses a header written with `salt`; `None` when the bytes are not a checksum-valid header.
pub fn parse_header(salt: u64, bytes: &[u8]) -> Option<Header> {
    let bytes: &[u8; HEADER_LEN] = bytes.get(..HEADER_LEN)?.try_into().ok()?;
    let stored = u32::from_le_bytes(bytes[24..28].try_into().ok()?);
    if header_crc(salt, &bytes[..24]) != stored {
        return None;
    }
    Some(Header {
        payload_len: u32::from_le_bytes(bytes[0..4].try_into().ok()?) as usize,
        seq: u64::from_le_bytes(bytes[4..12].try_into().ok()?),
        durable: u64::from_le_bytes(bytes[12..20].try_into().ok()?),
        payload_crc: u32::from_le_bytes(bytes[20..24].try_into().ok()?),
    })
}

/// Decodes a payload whose checksum matched. `offset` names the frame in errors.
pub fn decode_payload(header: &Header, payload: &[u8], offset: u64) -> Result<Frame, Error> {
    let bad = |reason: &str| Error::Corruption {
        location: format!("log frame at offset {offset} (seq {})", header.seq),
        reason: reason.to_string(),
    };
    if crc32fast::hash(payload) != header.payload_crc {
        return Err(bad("payload checksum mismatch"));
    }
    let mut rest = payload;
    let mut take = |n: usize| -> Result<&[u8], Error> {
        if rest.len() < n {
            return Err(bad("payload ends inside an entry"));
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let next_token = u64::from_le_bytes(take(8)?.try_into().expect("8 bytes"));
    let count = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
    // Each entry takes at least 3 bytes, so a hostile count cannot force a huge allocation.
    let mut entries = Vec::with_capacity(count.min(payload.len() / 3));
    for _ in 0..count {
        let kind = take(1)?[0];
        let key_len = u16::from_le_bytes(take(2)?.try_into().expect("2 bytes")) as usize;
        let key = take(key_len)?.to_vec();
        let record = match kind {
            KIND_PUT => {
                let len = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
                Some(take(len)?.to_vec())
            }
            KIND_DELETE => None,
            _ => return Err(bad("unknown entry kind")),
        };
        entries.push(Entry { key, record });
    }
    if !rest.is_empty() {
        return Err(bad("bytes left after the last entry"));
    }
    Ok(Frame {
        seq: header.seq,
        durable: header.durable,
        next_token,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Entry> {
        vec![
            Entry {
                key: b"\x01a\x01b\x01c".to_vec(),
                record: Some(b"record bytes".to_vec()),
            },
            Entry {
                key: b"\x01a\x01b\x01d".to_vec(),
                record: None,
            },
        ]
    }

    fn refs(entries: &[Entry]) -> impl ExactSizeIterator<Item = (&[u8], Option<&[u8]>)> {
        entries
            .iter()
            .map(|e| (e.key.as_slice(), e.record.as_deref()))
    }

    #[test]
    fn round_trip_and_alignment() {
        let mut out = Vec::new();
        encode(usize::MAX, 5, 9, 8, 77, refs(&sample()), &mut out);
        assert_eq!(out.len() % ALIGN, 0);
        let header = parse_header(5, &out).unwrap();
        assert_eq!(parse_header(6, &out), None, "another salt never parses");
        assert_eq!((header.seq, header.durable), (9, 8));
        assert_eq!(header.frame_len(), out.len());
        let frame = decode_payload(
            &header,
            &out[HEADER_LEN..HEADER_LEN + header.payload_len],
            0,
        )
        .unwrap();
        assert_eq!(
            frame,
            Frame {
                seq: 9,
                durable: 8,
                next_token: 77,
                entries: sample()
            }
        );
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let mut out = Vec::new();
        encode(usize::MAX, 0, 3, 2, 5, refs(&sample()), &mut out);
        let used = HEADER_LEN + parse_header(0, &out).unwrap().payload_len;
        for bit in 0..used * 8 {
            let mut damaged = out.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            let ok = parse_header(0, &damaged).and_then(|h| {
                damaged
                    .get(HEADER_LEN..HEADER_LEN + h.payload_len)
                    .and_then(|p| decode_payload(&h, p, 0).ok())
            });
            assert!(ok.is_none(), "bit {bit} undetected");
        }
    }

    #[test]
    fn hostile_payload_with_valid_crc_is_an_error() {
        let payload = [0u8, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 1];
        let header = Header {
            payload_len: payload.len(),
            seq: 1,
            durable: 0,
            payload_crc: crc32fast::hash(&payload),
        };
        assert!(decode_payload(&header, &payload, 0).is_err());
    }
}
