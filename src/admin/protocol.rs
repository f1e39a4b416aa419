//! The admin socket's messages, byte by byte (all integers little-endian):
//!
//! ```text
//! message  = len u32 | body                       (len <= MAX_MESSAGE)
//! request  = VERSION u8 | kind u8 | fields
//!   1 file info | 2 counts | 3 get key | 4 scan class u8 older_than opt_u64 limit u64
//!   5 expire key force u8 | 6 resolve key complete u8 retention opt_u64 result bytes
//!   7 sweep limit u64 | 8 checkpoint
//! response = 0 u8 | fields of the answer          (ok)
//!          | 1 u8 | message bytes | lease_until opt_u64
//!                                                 (the store's error, as text; the end of
//!                                                  the live lease that refused an expire)
//! key      = len u16 | the key's stored encoding  record = bytes (the record's stored form)
//! bytes    = len u32 | bytes                      opt_u64 = 0 u8 | 1 u8 u64
//! ```
//! Records travel in their stored, checksummed form, so a damaged message never passes as
//! data. Decoding never panics and never allocates more than the bytes it was given.

use std::path::PathBuf;
use std::time::Duration;

use crate::clock::duration_millis;
use crate::decide::Resolution;
use crate::key::Key;
use crate::record::Record;
use crate::record::RecordClass;
use crate::store::inspect::{FileInfo, ScanFilter, StateCounts};

/// The protocol version every request starts with.
pub const VERSION: u8 = 2;

/// The largest message either side accepts: a resolve carries one result (at most
/// [`Builder::MAX_RESULT_LEN_LIMIT`](crate::Builder::MAX_RESULT_LEN_LIMIT)); a scan answer is bounded by its
/// limit.
pub(crate) const MAX_MESSAGE: usize = crate::Builder::MAX_RESULT_LEN_LIMIT + (1 << 20);

/// What a client asks.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// [`Store::file_info`](crate::Store::file_info).
    FileInfo,
    /// [`Store::counts`](crate::Store::counts).
    Counts,
    /// [`Store::get`](crate::Store::get) of a key.
    Get(Key),
    /// [`Store::scan`](crate::Store::scan): the filter and the most records to return.
    Scan(ScanFilter, u64),
    /// [`Store::expire`](crate::Store::expire), or with `force`
    /// [`Store::expire_forced`](crate::Store::expire_forced).
    Expire {
        /// The key to expire.
        key: Key,
        /// Whether a live lease is expired too.
        force: bool,
    },
    /// [`Store::resolve`](crate::Store::resolve), with a retention of its own when given.
    Resolve {
        /// The key to resolve.
        key: Key,
        /// What it becomes.
        resolution: Resolution,
        /// How long a completed key is kept (`None`: the store's).
        retention: Option<Duration>,
    },
    /// [`Store::sweep`](crate::Store::sweep) of at most this many keys.
    Sweep(u64),
    /// [`Store::checkpoint`](crate::Store::checkpoint).
    Checkpoint,
}

impl Request {
    /// Whether the request changes the store (served only with
    /// [`AdminSocket::ReadWrite`](super::AdminSocket::ReadWrite)).
    pub(crate) fn writes(&self) -> bool {
        matches!(
            self,
            Request::Expire { .. }
                | Request::Resolve { .. }
                | Request::Sweep(_)
                | Request::Checkpoint
        )
    }

    /// The request's bytes, version first.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![VERSION];
        match self {
            Request::FileInfo => out.push(1),
            Request::Counts => out.push(2),
            Request::Get(key) => {
                out.push(3);
                put_key(&mut out, key);
            }
            Request::Scan(filter, limit) => {
                out.push(4);
                out.push(filter.class.map_or(0, class_code));
                put_opt(&mut out, filter.older_than.map(duration_millis));
                out.extend_from_slice(&limit.to_le_bytes());
            }
            Request::Expire { key, force } => {
                out.push(5);
                put_key(&mut out, key);
                out.push(u8::from(*force));
            }
            Request::Resolve {
                key,
                resolution,
                retention,
            } => {
                out.push(6);
                put_key(&mut out, key);
                put_opt(&mut out, retention.map(duration_millis));
                match resolution {
                    Resolution::Complete(result) => {
                        out.push(1);
                        put_bytes(&mut out, result);
                    }
                    Resolution::Release => out.push(0),
                }
            }
            Request::Sweep(limit) => {
                out.push(7);
                out.extend_from_slice(&limit.to_le_bytes());
            }
            Request::Checkpoint => out.push(8),
        }
        out
    }

    /// A request from its bytes, or why they are not one.
    pub fn decode(bytes: &[u8]) -> Result<Request, String> {
        let mut r = Reader(bytes);
        let version = r.u8()?;
        if version != VERSION {
            return Err(format!(
                "protocol version {version}, this store speaks {VERSION}"
            ));
        }
        let request = match r.u8()? {
            1 => Request::FileInfo,
            2 => Request::Counts,
            3 => Request::Get(r.key()?),
            4 => {
                let class = match r.u8()? {
                    0 => None,
                    code => Some(class_of_code(code)?),
                };
                let older_than = r.opt()?.map(Duration::from_millis);
                Request::Scan(ScanFilter { class, older_than }, r.u64()?)
            }
            5 => Request::Expire {
                key: r.key()?,
                force: r.u8()? != 0,
            },
            6 => {
                let key = r.key()?;
                let retention = r.opt()?.map(Duration::from_millis);
                let resolution = match r.u8()? {
                    0 => Resolution::Release,
                    _ => Resolution::Complete(r.bytes()?.to_vec()),
                };
                Request::Resolve {
                    key,
                    resolution,
                    retention,
                }
            }
            7 => Request::Sweep(r.u64()?),
            8 => Request::Checkpoint,
            kind => return Err(format!("unknown request kind {kind}")),
        };
        r.end()?;
        Ok(request)
    }
}

/// The store's error, as the client gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The error's message, with its causes.
    pub message: String,
    /// For [`Error::LeaseLive`](crate::Error::LeaseLive): the lease's end, in milliseconds.
    pub lease_until: Option<u64>,
}

impl Failure {
    pub(crate) fn of(error: &crate::Error) -> Failure {
        Failure {
            message: crate::error::with_causes(error),
            lease_until: match error {
                crate::Error::LeaseLive { lease_until, .. } => {
                    Some(crate::clock::to_millis(*lease_until))
                }
                _ => None,
            },
        }
    }

    pub(crate) fn refused(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            lease_until: None,
        }
    }
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The store file's facts.
    FileInfo(FileInfo),
    /// The records by class.
    Counts(StateCounts),
    /// A key's record, if stored.
    Get(Option<Record>),
    /// The records a scan found.
    Scan(Vec<(Key, Record)>),
    /// The class of the record expired, if any.
    Expire(Option<RecordClass>),
    /// A request that returns nothing was carried out.
    Done,
    /// How many keys a sweep deleted.
    Sweep(u64),
}

impl Answer {
    /// The encoded response: an answer, or the store's error as text.
    pub fn encode(answer: Result<Answer, Failure>) -> Vec<u8> {
        let answer = match answer {
            Ok(answer) => answer,
            Err(failure) => {
                let mut out = vec![1];
                put_bytes(&mut out, failure.message.as_bytes());
                put_opt(&mut out, failure.lease_until);
                return out;
            }
        };
        let mut out = vec![0];
        match answer {
            Answer::FileInfo(info) => {
                put_bytes(&mut out, path_bytes(&info.path));
                put_bytes(&mut out, path_bytes(&info.log_path));
                for n in [
                    info.file_bytes,
                    info.log_bytes,
                    info.wal_seq,
                    info.next_token,
                    info.log_since_checkpoint,
                    info.checkpoint_room,
                    info.token_floor,
                ] {
                    out.extend_from_slice(&n.to_le_bytes());
                }
            }
            Answer::Counts(counts) => {
                for n in [
                    counts.pending,
                    counts.stale,
                    counts.needs_review,
                    counts.completed,
                    counts.expired,
                    counts.damaged,
                ] {
                    out.extend_from_slice(&n.to_le_bytes());
                }
                put_record(&mut out, counts.oldest_pending.as_ref());
            }
            Answer::Get(record) => match record {
                None => out.push(0),
                Some(record) => {
                    out.push(1);
                    put_bytes(&mut out, &record.encode());
                }
            },
            Answer::Scan(found) => {
                let count = u32::try_from(found.len()).unwrap_or(u32::MAX);
                out.extend_from_slice(&count.to_le_bytes());
                for (key, record) in found.iter().take(count as usize) {
                    put_key(&mut out, key);
                    put_bytes(&mut out, &record.encode());
                }
            }
            Answer::Expire(class) => out.push(class.map_or(0, class_code)),
            Answer::Done => {}
            Answer::Sweep(n) => out.extend_from_slice(&n.to_le_bytes()),
        }
        out
    }

    /// Decodes the answer to `request`; the inner `Err` is the store's error message.
    pub fn decode(request: &Request, bytes: &[u8]) -> Result<Result<Answer, Failure>, String> {
        let mut r = Reader(bytes);
        if r.u8()? != 0 {
            let message = String::from_utf8_lossy(r.bytes()?).into_owned();
            let lease_until = r.opt()?;
            r.end()?;
            return Ok(Err(Failure {
                message,
                lease_until,
            }));
        }
        let answer = match request {
            Request::FileInfo => Answer::FileInfo(FileInfo {
                path: bytes_path(r.bytes()?),
                log_path: bytes_path(r.bytes()?),
                file_bytes: r.u64()?,
                log_bytes: r.u64()?,
                wal_seq: r.u64()?,
                next_token: r.u64()?,
                log_since_checkpoint: r.u64()?,
                checkpoint_room: r.u64()?,
                token_floor: r.u64()?,
            }),
            Request::Counts => Answer::Counts(StateCounts {
                pending: r.u64()?,
                stale: r.u64()?,
                needs_review: r.u64()?,
                completed: r.u64()?,
                expired: r.u64()?,
                damaged: r.u64()?,
                oldest_pending: match r.u8()? {
                    0 => None,
                    _ => Some((r.key()?, r.record()?)),
                },
            }),
            Request::Get(_) => Answer::Get(match r.u8()? {
                0 => None,
                _ => Some(r.record()?),
            }),
            Request::Scan(..) => {
                let count = r.u32()?;
                let mut found = Vec::new();
                for _ in 0..count {
                    found.push((r.key()?, r.record()?));
                }
                Answer::Scan(found)
            }
            Request::Expire { .. } => Answer::Expire(match r.u8()? {
                0 => None,
                code => Some(class_of_code(code)?),
            }),
            Request::Resolve { .. } | Request::Checkpoint => Answer::Done,
            Request::Sweep(_) => Answer::Sweep(r.u64()?),
        };
        r.end()?;
        Ok(Ok(answer))
    }
}

fn class_code(class: RecordClass) -> u8 {
    match class {
        RecordClass::Pending => 1,
        RecordClass::Stale => 2,
        RecordClass::NeedsReview => 3,
        RecordClass::Completed => 4,
        RecordClass::Expired => 5,
    }
}

fn class_of_code(code: u8) -> Result<RecordClass, String> {
    RecordClass::ALL
        .into_iter()
        .find(|class| class_code(*class) == code)
        .ok_or_else(|| format!("unknown record class {code}"))
}

fn put_key(out: &mut Vec<u8>, key: &Key) {
    let encoded = key.encoded();
    let len = u16::try_from(encoded.len()).expect("encoded keys are at most 768 bytes");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(encoded);
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).expect("admin messages are below 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

fn put_opt(out: &mut Vec<u8>, value: Option<u64>) {
    match value {
        None => out.push(0),
        Some(n) => {
            out.push(1);
            out.extend_from_slice(&n.to_le_bytes());
        }
    }
}

fn put_record(out: &mut Vec<u8>, entry: Option<&(Key, Record)>) {
    match entry {
        None => out.push(0),
        Some((key, record)) => {
            out.push(1);
            put_key(out, key);
            put_bytes(out, &record.encode());
        }
    }
}

fn path_bytes(path: &std::path::Path) -> &[u8] {
    use std::os::unix::ffi::OsStrExt;
    path.as_os_str().as_bytes()
}

fn bytes_path(bytes: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    PathBuf::from(std::ffi::OsStr::from_bytes(bytes))
}

/// Reads fields off a message; every read checks the length first.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!(
                "message ends early: {n} bytes wanted, {} left",
                self.0.len()
            ));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn opt(&mut self) -> Result<Option<u64>, String> {
        match self.u8()? {
            0 => Ok(None),
            _ => self.u64().map(Some),
        }
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    fn key(&mut self) -> Result<Key, String> {
        let len = u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes"));
        let bytes = self.take(usize::from(len))?;
        Key::decode(bytes).ok_or_else(|| "a key that does not decode".to_string())
    }

    fn record(&mut self) -> Result<Record, String> {
        Record::decode(self.bytes()?)
    }

    fn end(&self) -> Result<(), String> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} unexpected bytes after the message",
                self.0.len()
            ))
        }
    }
}
