//! Records: the state stored for each key, and its versioned, checksummed binary encoding.
//!
//! The layout is documented byte by byte in `docs/format.md`. All integers are little-endian.

use std::time::SystemTime;

use crate::clock::from_millis;
use crate::fingerprint::Fingerprint;
use crate::reservation::Progress;

/// Longest review note accepted by [`Store::mark_needs_review`](crate::Store::mark_needs_review), in bytes.
pub const MAX_NOTE_LEN: usize = 4096;

/// The record layout version written by this build.
pub(crate) const RECORD_VERSION: u8 = 1;

const TAG_PENDING: u8 = 1;
const TAG_COMPLETED: u8 = 2;
const TAG_NEEDS_REVIEW: u8 = 3;

/// Bytes before the payload: version, tag, fingerprint, token, attempt, two times, payload length.
const HEADER_LEN: usize = 1 + 1 + Fingerprint::LEN + 8 + 4 + 8 + 8 + 4;
const CRC_LEN: usize = 4;

/// Time in milliseconds since the Unix epoch; `u64::MAX` means never.
pub(crate) type Millis = u64;

/// The stored state of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub(crate) fingerprint: Fingerprint,
    /// The fencing token of the acquisition that produced this state.
    pub(crate) token: u64,
    /// How many times the key has been acquired.
    pub(crate) attempt: u32,
    /// When the record stops existing (it then reads as absent, and a sweep deletes it).
    pub(crate) expires_at: Millis,
    pub(crate) state: State,
}

/// The state-specific part of a [`Record`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    Pending {
        lease_until: Millis,
        progress: Option<Progress>,
    },
    Completed {
        completed_at: Millis,
        result: Vec<u8>,
    },
    NeedsReview {
        since: Millis,
        note: String,
    },
}

/// A read-only view of a record's state, from [`Record::status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status<'a> {
    /// Reserved; the lease holder is doing the work.
    Pending {
        /// When the lease runs out and the key becomes stale.
        lease_until: SystemTime,
        /// The last recovery point recorded with
        /// [`Store::record_step`](crate::Store::record_step).
        progress: Option<&'a Progress>,
    },
    /// Done; the result is replayed to duplicates.
    Completed {
        /// The stored result.
        result: &'a [u8],
        /// When it was completed.
        completed_at: SystemTime,
    },
    /// Parked for a person; duplicates are refused until it is resolved.
    NeedsReview {
        /// The note left by [`Store::mark_needs_review`](crate::Store::mark_needs_review).
        note: &'a str,
        /// When it was marked.
        since: SystemTime,
    },
}

impl Record {
    /// The fingerprint of the request that first reserved the key.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The fencing token of the latest acquisition.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// How many times the key has been acquired (1 for a first attempt).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When the record expires: for a completed key, the end of its retention; for a pending
    /// key, the end of its lease plus the retention (an abandoned reservation). `None` for a
    /// key under review, which never expires.
    pub fn expires_at(&self) -> Option<SystemTime> {
        (self.expires_at != Millis::MAX).then(|| from_millis(self.expires_at))
    }

    /// The state-specific part.
    pub fn status(&self) -> Status<'_> {
        match &self.state {
            State::Pending {
                lease_until,
                progress,
            } => Status::Pending {
                lease_until: from_millis(*lease_until),
                progress: progress.as_ref(),
            },
            State::Completed {
                completed_at,
                result,
            } => Status::Completed {
                result,
                completed_at: from_millis(*completed_at),
            },
            State::NeedsReview { since, note } => Status::NeedsReview {
                note,
                since: from_millis(*since),
            },
        }
    }

    /// Whether the record reads as absent at `now`.
    pub(crate) fn is_expired(&self, now: Millis) -> bool {
        now >= self.expires_at
    }

    /// The lease deadline, for a pending record.
    pub(crate) fn lease_until(&self) -> Option<Millis> {
        match self.state {
            State::Pending { lease_until, .. } => Some(lease_until),
            _ => None,
        }
    }

    /// Encodes the record in the current layout, checksum included.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let progress_bytes;
        let (tag, time, payload): (u8, Millis, &[u8]) = match &self.state {
            State::Pending {
                lease_until,
                progress,
            } => {
                progress_bytes = progress
                    .as_ref()
                    .map(|p| [&p.step.to_le_bytes()[..], &p.data].concat())
                    .unwrap_or_default();
                (TAG_PENDING, *lease_until, progress_bytes.as_slice())
            }
            State::Completed {
                completed_at,
                result,
            } => (TAG_COMPLETED, *completed_at, result),
            State::NeedsReview { since, note } => (TAG_NEEDS_REVIEW, *since, note.as_bytes()),
        };
        let payload_len =
            u32::try_from(payload.len()).expect("payload length is validated before encoding");
        let mut out = Vec::with_capacity(HEADER_LEN + payload.len() + CRC_LEN);
        out.push(RECORD_VERSION);
        out.push(tag);
        out.extend_from_slice(self.fingerprint.as_bytes());
        out.extend_from_slice(&self.token.to_le_bytes());
        out.extend_from_slice(&self.attempt.to_le_bytes());
        out.extend_from_slice(&time.to_le_bytes());
        out.extend_from_slice(&self.expires_at.to_le_bytes());
        out.extend_from_slice(&payload_len.to_le_bytes());
        out.extend_from_slice(payload);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
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

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Record> {
        let fingerprint = Fingerprint::of(b"req");
        vec![
            Record {
                fingerprint,
                token: 1,
                attempt: 1,
                expires_at: 99,
                state: State::Pending {
                    lease_until: 10,
                    progress: None,
                },
            },
            Record {
                fingerprint,
                token: 2,
                attempt: 1,
                expires_at: 99,
                state: State::Pending {
                    lease_until: 10,
                    progress: Some(Progress {
                        step: 3,
                        data: b"charge ch_1 created".to_vec(),
                    }),
                },
            },
            Record {
                fingerprint,
                token: u64::MAX,
                attempt: 7,
                expires_at: 5_000,
                state: State::Completed {
                    completed_at: 20,
                    result: b"200 OK".to_vec(),
                },
            },
            Record {
                fingerprint,
                token: 3,
                attempt: 2,
                expires_at: Millis::MAX,
                state: State::NeedsReview {
                    since: 30,
                    note: "gateway timeout, charge unknown".into(),
                },
            },
        ]
    }

    #[test]
    fn encode_decode_round_trip() {
        for record in samples() {
            assert_eq!(Record::decode(&record.encode()), Ok(record));
        }
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        for record in samples() {
            let bytes = record.encode();
            for bit in 0..bytes.len() * 8 {
                let mut damaged = bytes.clone();
                damaged[bit / 8] ^= 1 << (bit % 8);
                assert!(Record::decode(&damaged).is_err(), "bit {bit} undetected");
            }
        }
    }

    #[test]
    fn truncated_and_garbage_bytes_are_errors() {
        let bytes = samples()[2].encode();
        for len in 0..bytes.len() {
            assert!(Record::decode(&bytes[..len]).is_err());
        }
        assert!(Record::decode(&[0xff; 200]).is_err());
    }

    #[test]
    fn wrong_length_field_with_valid_crc_is_an_error() {
        let mut bytes = samples()[2].encode();
        bytes.truncate(bytes.len() - CRC_LEN);
        bytes[HEADER_LEN - 4] = 99; // payload length field
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        let err = Record::decode(&bytes).unwrap_err();
        assert!(err.contains("payload length"), "{err}");
    }
}
