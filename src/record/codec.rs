//! A record's binary encoding: versioned, little-endian, with a CRC-32 over everything before
//! it. The layout is documented byte by byte in `docs/format.md`.

use crate::fingerprint::Fingerprint;
use crate::record::Progress;

use crate::record::{Millis, Record, State};

/// The record layout version written by this build.
pub(crate) const RECORD_VERSION: u8 = 1;

const TAG_PENDING: u8 = 1;
const TAG_COMPLETED: u8 = 2;
const TAG_NEEDS_REVIEW: u8 = 3;

/// Bytes before the payload: version, tag, fingerprint, token, attempt, two times, payload length.
pub const HEADER_LEN: usize = 1 + 1 + Fingerprint::LEN + 8 + 4 + 8 + 8 + 4;
const CRC_LEN: usize = 4;

impl Record {
    /// Encodes the record in the current layout, checksum included.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut out);
        out
    }

    /// The length of [`encode`](Record::encode)'s bytes.
    pub(crate) fn encoded_len(&self) -> usize {
        HEADER_LEN + self.payload().1 + CRC_LEN
    }

    /// Appends [`encode`](Record::encode)'s bytes to `out` (the log frame being written, or
    /// the applier's buffer: a logged record is encoded where it goes, with no vector of its
    /// own).
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        let ((tag, time), payload_len) = self.payload();
        let payload_len =
            u32::try_from(payload_len).expect("payload length is validated before encoding");
        out.reserve(HEADER_LEN + payload_len as usize + CRC_LEN);
        out.push(RECORD_VERSION);
        out.push(tag);
        out.extend_from_slice(self.fingerprint.as_bytes());
        out.extend_from_slice(&self.token.to_le_bytes());
        out.extend_from_slice(&self.attempt.to_le_bytes());
        out.extend_from_slice(&time.to_le_bytes());
        out.extend_from_slice(&self.expires_at.to_le_bytes());
        out.extend_from_slice(&payload_len.to_le_bytes());
        match &self.state {
            State::Pending { progress, .. } => {
                if let Some(p) = progress {
                    out.extend_from_slice(&p.step.to_le_bytes());
                    out.extend_from_slice(&p.data);
                }
            }
            State::Completed { result, .. } => out.extend_from_slice(result),
            State::NeedsReview { note, .. } => out.extend_from_slice(note.as_bytes()),
        }
        let crc = crc32fast::hash(&out[start..]);
        out.extend_from_slice(&crc.to_le_bytes());
    }

    /// The state's tag and time, and its payload's length.
    fn payload(&self) -> ((u8, Millis), usize) {
        match &self.state {
            State::Pending {
                lease_until,
                progress,
            } => (
                (TAG_PENDING, *lease_until),
                progress.as_ref().map_or(0, |p| 4 + p.data.len()),
            ),
            State::Completed {
                completed_at,
                result,
            } => ((TAG_COMPLETED, *completed_at), result.len()),
            State::NeedsReview { since, note } => ((TAG_NEEDS_REVIEW, *since), note.len()),
        }
    }

    /// Decodes a stored record. Never panics: any damage is an `Err` with a reason.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Record, String> {
        if bytes.len() < HEADER_LEN + CRC_LEN {
            return Err(format!(
                "record is {} bytes, shorter than the {} byte minimum",
                bytes.len(),
                HEADER_LEN + CRC_LEN
            ));
        }
        let (body, crc) = bytes.split_at(bytes.len() - CRC_LEN);
        let stored = u32::from_le_bytes(crc.try_into().expect("split at CRC_LEN"));
        let actual = crc32fast::hash(body);
        if stored != actual {
            return Err(format!(
                "checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
            ));
        }
        let mut reader = Reader(body);
        let version = reader.u8();
        if version != RECORD_VERSION {
            return Err(format!(
                "record layout version {version} is not supported (this build reads {RECORD_VERSION})"
            ));
        }
        let tag = reader.u8();
        let fingerprint = Fingerprint::from_bytes(reader.array());
        let token = reader.u64();
        let attempt = reader.u32();
        let time = reader.u64();
        let expires_at = reader.u64();
        let payload_len = reader.u32() as usize;
        let payload = reader.0;
        if payload.len() != payload_len {
            return Err(format!(
                "payload length field says {payload_len} bytes but {} follow",
                payload.len()
            ));
        }
        let state = match tag {
            TAG_PENDING => State::Pending {
                lease_until: time,
                progress: match payload.len() {
                    0 => None,
                    1..=3 => return Err("pending record's recovery point is cut short".into()),
                    _ => Some(Progress {
                        step: u32::from_le_bytes(payload[..4].try_into().expect("4 bytes")),
                        data: payload[4..].to_vec(),
                    }),
                },
            },
            TAG_COMPLETED => State::Completed {
                completed_at: time,
                result: payload.to_vec(),
            },
            TAG_NEEDS_REVIEW => State::NeedsReview {
                since: time,
                note: String::from_utf8(payload.to_vec())
                    .map_err(|_| "review note is not UTF-8".to_string())?,
            },
            other => return Err(format!("unknown state tag {other}")),
        };
        Ok(Record {
            fingerprint,
            token,
            attempt,
            expires_at,
            state,
        })
    }
}

/// Reads fixed-size little-endian fields; callers check the length first.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn array<const N: usize>(&mut self) -> [u8; N] {
        let (head, tail) = self.0.split_at(N);
        self.0 = tail;
        head.try_into().expect("split at N")
    }
    fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }
}
