//! The admin socket's server: one background thread that answers one request per
//! connection, from a handle on the store's parts, to its owner's user only.
//!
//! The socket is never reachable at its path by another user, not even for an instant: it is
//! bound inside a new directory of mode 0700 next to its path (`.NAME.a`, NAME being the store
//! file's name; a name no longer than the socket's, so that whatever path fits a socket address
//! fits both), given mode 0600 there, and only then linked to its path (`link(2)`, which never
//! replaces a file). Binding it at its path and setting its mode afterwards would leave it open
//! to everyone, under the usual umask, between the two. Each connection's credentials are then
//! checked (`peer.rs`).

use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::protocol::{Answer, Failure, Request, MAX_MESSAGE};
use super::{peer, socket_path, AdminSocket};
use crate::answers::LiveLease;
use crate::error::{Error, StorageError};
use crate::store::Store;

/// The longest socket path a Unix socket address holds (`sun_path` is 108 bytes on Linux,
/// with its terminating zero).
const MAX_SOCKET_PATH: usize = 107;
/// How often the idle server checks for a connection and for its store being dropped.
const POLL: Duration = Duration::from_millis(25);
/// After answering, the server rests this many times as long as the answer took, so that
/// however fast clients ask, the admin thread uses at most a fifth of one core.
const REST_FACTOR: u32 = 4;
/// How long a connection may take to send its request or read its answer.
pub(super) const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// A running admin socket; stopped (and its file removed) when dropped.
pub(crate) struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl Server {
    /// Serves `store` (a handle sharing the owner's parts) on the socket next to its file.
    pub(crate) fn start(store: Store, access: AdminSocket) -> Result<Option<Server>, StorageError> {
        if access == AdminSocket::Off {
            return Ok(None);
        }
        let path = socket_path(store.path());
        let listener = bind(&path)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = thread::Builder::new()
            .name("idemstore-admin".into())
            .spawn({
                let stop = Arc::clone(&stop);
                let path = path.clone();
                move || serve(&listener, &path, &store, access, &stop)
            })
            .map_err(|e| StorageError::io("starting the admin socket's thread", e))?;
        Ok(Some(Server {
            stop,
            thread: Some(thread),
            path,
        }))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds the socket at `path`, replacing a socket file a dead process left (the caller owns
/// the store, so no live process serves it), never any other kind of file; through a private
/// directory (the module's docs), so that it has mode 0600 from its first instant at `path`.
fn bind(path: &Path) -> Result<UnixListener, StorageError> {
    let context = |what: &str| format!("{what} the admin socket {}", path.display());
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(StorageError::io(
            context("creating"),
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "its path is {len} bytes and a Unix socket address holds at most \
                     {MAX_SOCKET_PATH}: move the store to a shorter path, or open it with \
                     Builder::admin_socket(AdminSocket::Off)"
                ),
            ),
        ));
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)
            .map_err(|e| StorageError::io(context("removing the stale"), e))?,
        Ok(_) => {
            return Err(StorageError::io(
                context("creating"),
                in_the_way("a socket"),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(StorageError::io(context("checking"), e)),
    }
    let private = private_dir(path);
    let private_context = |what: &str| {
        format!(
            "{what} {}, the private directory the admin socket {} is bound in",
            private.display(),
            path.display()
        )
    };
    remove_left_private_dir(&private)
        .map_err(|e| StorageError::io(private_context("clearing"), e))?;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(|e| StorageError::io(private_context("creating"), e))?;
    let bound = private.join("s");
    let listener = UnixListener::bind(&bound)
        .map_err(|e| StorageError::io(context("binding"), e))
        .and_then(|listener| {
            std::fs::set_permissions(&bound, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| StorageError::io(context("restricting the permissions of"), e))?;
            listener
                .set_nonblocking(true)
                .map_err(|e| StorageError::io(context("configuring"), e))?;
            link_into_place(&bound, path).map_err(|e| StorageError::io(context("linking"), e))?;
            Ok(listener)
        });
    let _ = std::fs::remove_file(&bound);
    let _ = std::fs::remove_dir(&private);
    listener
}

/// The private directory the socket at `path` is bound in: `.NAME.a` next to it (the socket
/// `.NAME.a/s` is a byte shorter than `NAME.admin`).
fn private_dir(path: &Path) -> PathBuf {
    let name = path.file_stem().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.a"))
}

/// Removes the private directory a process that died while binding left, with the socket in
/// it; anything else at that path is left untouched and refused.
fn remove_left_private_dir(private: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(private) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(meta) if !meta.is_dir() => Err(in_the_way("a directory")),
        Ok(_) => {
            let bound = private.join("s");
            if std::fs::symlink_metadata(&bound).is_ok_and(|m| m.file_type().is_socket()) {
                std::fs::remove_file(&bound)?;
            }
            std::fs::remove_dir(private)
        }
    }
}

fn in_the_way(expected: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("a file that is not {expected} is in the way; it was left untouched"),
    )
}

/// Gives the bound socket its path: a hard link, which fails rather than replace a file put
/// there since the check; a rename on file systems without hard links (checked first, a narrow
/// race remains), as the store file is given its name (`store/open/file.rs`).
fn link_into_place(bound: &Path, path: &Path) -> io::Result<()> {
    match std::fs::hard_link(bound, path) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists && !path.exists() => {
            std::fs::rename(bound, path)
        }
        done => done,
    }
}

fn serve(
    listener: &UnixListener,
    path: &Path,
    store: &Store,
    access: AdminSocket,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            // A client's failure (it hung up, sent garbage, stalled) ends its connection only.
            Ok((stream, _)) => {
                let started = Instant::now();
                let _ = answer(stream, path, store, access);
                // Rest in short naps, so that dropping the store never waits for the rest.
                let rest_until = Instant::now() + started.elapsed() * REST_FACTOR;
                while !stop.load(Ordering::Relaxed) && Instant::now() < rest_until {
                    thread::sleep(POLL.min(rest_until - Instant::now()));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(POLL),
            Err(_) => thread::sleep(POLL),
        }
    }
}

/// Reads one request from `stream`, answers it and closes the connection. A connection from
/// another user is answered with its refusal before anything is read.
fn answer(
    mut stream: UnixStream,
    path: &Path,
    store: &Store,
    access: AdminSocket,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    if let Some(reason) = peer::refusal(&stream, path) {
        return write_message(&mut stream, &Answer::encode(Err(Failure::refused(reason))));
    }
    let response = match read_message(&mut stream)? {
        Err(reason) => Answer::encode(Err(Failure::refused(reason))),
        Ok(bytes) => Answer::encode(match Request::decode(&bytes) {
            Err(reason) => Err(Failure::refused(format!("bad admin request: {reason}"))),
            Ok(request) if request.writes() && access != AdminSocket::ReadWrite => {
                Err(Failure::refused(
                    "this store's admin socket is read-only (AdminSocket::ReadOnly); changes \
                     need AdminSocket::ReadWrite in the service, or the service stopped",
                ))
            }
            Ok(request) => run(store, request).map_err(|e| Failure::of(&e)),
        }),
    };
    write_message(&mut stream, &response)
}

fn run(store: &Store, request: Request) -> Result<Answer, Error> {
    Ok(match request {
        Request::FileInfo => Answer::FileInfo(store.file_info()?),
        Request::Counts => Answer::Counts(store.counts()?),
        Request::Get(key) => Answer::Get(store.get(&key)?),
        Request::Scan(filter, limit) => {
            Answer::Scan(store.scan(&filter, usize::try_from(limit).unwrap_or(usize::MAX))?)
        }
        Request::Expire { key, force } => {
            let live = if force {
                LiveLease::Take
            } else {
                LiveLease::Refuse
            };
            Answer::Expire(store.expire_many(&[key], live)?.remove(0)?)
        }
        Request::Resolve {
            key,
            resolution,
            retention,
        } => {
            match retention {
                Some(retention) => store.resolve_with_retention(&key, resolution, retention)?,
                None => store.resolve(&key, resolution)?,
            }
            Answer::Done
        }
        Request::Sweep(limit) => {
            Answer::Sweep(store.sweep(usize::try_from(limit).unwrap_or(usize::MAX))? as u64)
        }
        Request::Checkpoint => {
            store.checkpoint()?;
            Answer::Done
        }
    })
}

/// Reads one length-prefixed message; the inner `Err` is a message over the limit.
pub(super) fn read_message(stream: &mut impl Read) -> io::Result<Result<Vec<u8>, String>> {
    let mut len = [0; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Ok(Err(format!(
            "a message of {len} bytes; the limit is {MAX_MESSAGE} bytes"
        )));
    }
    let mut bytes = Vec::new();
    stream.take(len as u64).read_to_end(&mut bytes)?;
    if bytes.len() != len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the admin message ends early",
        ));
    }
    Ok(Ok(bytes))
}

pub(super) fn write_message(stream: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    let len = u32::try_from(bytes.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "an admin message over 4 GiB"))?;
    stream.write_all(&len.to_le_bytes())?;
    stream.write_all(bytes)?;
    stream.flush()
}
