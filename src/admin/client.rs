//! [`AdminClient`]: asks a running store's admin socket.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::protocol::{Answer, Failure, Request};
use super::server::{read_message, write_message};
use super::socket_path;
use crate::answers::LiveLease;
use crate::clock::{from_millis, to_millis};
use crate::decide::Resolution;
use crate::error::{Error, StorageError};
use crate::key::Key;
use crate::record::RecordClass;
use crate::record::{Record, TokenFloor};
use crate::store::inspect::{FileInfo, ScanFilter, StateCounts};

/// How long a client waits for an answer. A sweep slice or a checkpoint of a large store
/// can take a while.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// A client of a running store's admin socket (see [`Builder::admin_socket`](crate::Builder::admin_socket)):
/// the same answers as the inspection calls of the [`Store`](crate::Store) that owns the file,
/// from another process. Each call is one connection.
///
/// # Errors
/// Every call returns [`StorageError::Io`](crate::StorageError::Io) naming the socket when it cannot be reached (no service
/// holds the store, or it runs without the setting), and [`Error::Admin`] with the store's own
/// message when the store refused the request.
#[derive(Debug, Clone)]
pub struct AdminClient {
    socket: PathBuf,
    /// The serving owner's token floor, read when connecting.
    floor: TokenFloor,
}

impl AdminClient {
    /// A client of the store at `store_path`, checking that its socket answers.
    ///
    /// # Errors
    /// [`StorageError::Io`](crate::StorageError::Io) naming the socket when nothing listens on it.
    pub fn connect(store_path: impl AsRef<Path>) -> Result<AdminClient, Error> {
        let mut client = AdminClient {
            socket: socket_path(store_path.as_ref()),
            floor: TokenFloor::NONE,
        };
        client.floor = TokenFloor(client.file_info()?.token_floor);
        Ok(client)
    }

    /// The socket this client asks.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// [`Store::file_info`](crate::Store::file_info) of the live store.
    ///
    /// # Errors
    /// See [`AdminClient`].
    pub fn file_info(&self) -> Result<FileInfo, Error> {
        match self.ask(&Request::FileInfo)? {
            Answer::FileInfo(info) => Ok(info),
            other => Err(self.unexpected(&other)),
        }
    }

    /// [`Store::counts`](crate::Store::counts) of the live store: every acknowledged record.
    ///
    /// # Errors
    /// See [`AdminClient`].
    pub fn counts(&self) -> Result<StateCounts, Error> {
        match self.ask(&Request::Counts)? {
            Answer::Counts(counts) => Ok(counts),
            other => Err(self.unexpected(&other)),
        }
    }

    /// [`Store::get`](crate::Store::get) of the live store.
    ///
    /// # Errors
    /// See [`AdminClient`].
    pub fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        match self.ask(&Request::Get(key.clone()))? {
            Answer::Get(record) => Ok(record),
            other => Err(self.unexpected(&other)),
        }
    }

    /// [`Store::scan`](crate::Store::scan) of the live store.
    ///
    /// # Errors
    /// See [`AdminClient`].
    pub fn scan(&self, filter: &ScanFilter, limit: usize) -> Result<Vec<(Key, Record)>, Error> {
        match self.ask(&Request::Scan(filter.clone(), limit as u64))? {
            Answer::Scan(found) => Ok(found),
            other => Err(self.unexpected(&other)),
        }
    }

    /// The [`RecordClass`] of `record` now, by this machine's system clock (a service's
    /// store runs on the system clock), with the serving store's rules: a reservation made
    /// before the service last opened the store is stale (unless it runs with
    /// [`Builder::leases_survive_restart`](crate::Builder::leases_survive_restart)). The
    /// owner's [`token_floor`](FileInfo::token_floor) is read when connecting.
    pub fn class_of(&self, record: &Record) -> RecordClass {
        record.class(to_millis(SystemTime::now()), self.floor)
    }

    /// [`Store::expire`](crate::Store::expire) or [`Store::expire_forced`](crate::Store::expire_forced)
    /// in the live store (needs [`AdminSocket::ReadWrite`](super::AdminSocket::ReadWrite)).
    ///
    /// # Errors
    /// See [`AdminClient`]; [`Error::LeaseLive`] naming the lease's end, as the store
    /// answers it.
    pub fn expire(&self, key: &Key, live: LiveLease) -> Result<Option<RecordClass>, Error> {
        let request = Request::Expire {
            key: key.clone(),
            force: live == LiveLease::Take,
        };
        match self.ask_raw(&request) {
            Ok(Answer::Expire(class)) => Ok(class),
            Ok(other) => Err(self.unexpected(&other)),
            Err(Refused(failure)) => Err(match failure.lease_until {
                Some(lease_until) => Error::LeaseLive {
                    key: key.clone(),
                    lease_until: from_millis(lease_until),
                },
                None => self.admin_error(failure),
            }),
            Err(Failed(error)) => Err(error),
        }
    }

    /// [`Store::resolve`](crate::Store::resolve) in the live store, with the key's own
    /// retention or `retention` ([`Store::resolve_with_retention`](crate::Store::resolve_with_retention)).
    ///
    /// # Errors
    /// See [`AdminClient`].
    pub fn resolve(
        &self,
        key: &Key,
        resolution: Resolution,
        retention: Option<Duration>,
    ) -> Result<(), Error> {
        let request = Request::Resolve {
            key: key.clone(),
            resolution,
            retention,
        };
        match self.ask(&request)? {
            Answer::Done => Ok(()),
            other => Err(self.unexpected(&other)),
        }
    }

    /// [`Store::sweep`](crate::Store::sweep) in the live store.
    ///
    /// # Errors
    /// See [`AdminClient`].
    pub fn sweep(&self, limit: usize) -> Result<usize, Error> {
        match self.ask(&Request::Sweep(limit as u64))? {
            Answer::Sweep(n) => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
            other => Err(self.unexpected(&other)),
        }
    }

    /// [`Store::checkpoint`](crate::Store::checkpoint) in the live store.
    ///
    /// # Errors
    /// See [`AdminClient`].
    pub fn checkpoint(&self) -> Result<(), Error> {
        match self.ask(&Request::Checkpoint)? {
            Answer::Done => Ok(()),
            other => Err(self.unexpected(&other)),
        }
    }

    fn stream(&self) -> Result<UnixStream, Error> {
        UnixStream::connect(&self.socket).map_err(|e| {
            StorageError::io(
                format!(
                    "connecting to the admin socket {} (is a service holding the store with Builder::admin_socket?)",
                    self.socket.display()
                ),
                e,
            )
            .into()
        })
    }

    /// Asks, turning a refusal into [`Error::Admin`].
    fn ask(&self, request: &Request) -> Result<Answer, Error> {
        self.ask_raw(request).map_err(|e| match e {
            Refused(failure) => self.admin_error(failure),
            Failed(error) => error,
        })
    }

    fn admin_error(&self, failure: Failure) -> Error {
        Error::Admin {
            socket: self.socket.clone(),
            message: failure.message,
        }
    }

    fn ask_raw(&self, request: &Request) -> Result<Answer, Asked> {
        let mut stream = self.stream()?;
        let io_error = |e: io::Error| -> Error {
            StorageError::io(
                format!("talking to the admin socket {}", self.socket.display()),
                e,
            )
            .into()
        };
        stream
            .set_read_timeout(Some(ANSWER_TIMEOUT))
            .map_err(io_error)?;
        write_message(&mut stream, &request.encode()).map_err(io_error)?;
        let bytes = read_message(&mut stream)
            .map_err(io_error)?
            .map_err(|reason| self.bad_answer(reason))?;
        match Answer::decode(request, &bytes).map_err(|reason| self.bad_answer(reason))? {
            Ok(answer) => Ok(answer),
            Err(failure) => Err(Refused(failure)),
        }
    }

    fn bad_answer(&self, reason: String) -> Error {
        StorageError::Corruption {
            location: format!("an answer of the admin socket {}", self.socket.display()),
            reason,
        }
        .into()
    }

    fn unexpected(&self, answer: &Answer) -> Error {
        self.bad_answer(format!("an answer of the wrong kind: {answer:?}"))
    }
}

/// Why a request got no answer: the store refused it, or it never got there.
enum Asked {
    Refused(Failure),
    Failed(Error),
}

use Asked::{Failed, Refused};

impl From<Error> for Asked {
    fn from(error: Error) -> Asked {
        Failed(error)
    }
}
