//! Who may talk to the admin socket: the user the store runs as, and root, told by the
//! credentials the kernel recorded for the connection (`SO_PEERCRED`), not by anything the
//! client says.
//!
//! Root is let in: it can read the store's files whatever their mode, so refusing it would
//! protect nothing and only stop an operator's `sudo idemstore stats FILE`. Everyone else is
//! refused, even a process that could reach the socket file past its mode (one holding
//! `CAP_DAC_OVERRIDE`, or handed a connection by another).

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};

/// Connections refused by their credentials in this process.
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// How many connections the admin sockets of this process refused because they came from
/// another user (neither the store's user nor root), since the process started. Each refusal
/// is also logged (a `warn` event, with the `tracing` feature) and answered with a message
/// naming both users.
pub fn refused_connections() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

/// `None` when the peer of `stream` may use the socket at `socket`; otherwise the reason it may
/// not, to answer it with. Counts (and logs) each refusal.
pub(super) fn refusal(stream: &UnixStream, socket: &std::path::Path) -> Option<String> {
    let reason = match credentials::peer_and_own(stream) {
        Ok(Some((peer, own))) if admits(peer, own) => return None,
        Ok(Some((peer, own))) => format!(
            "the admin socket {} serves its owner's user (uid {own}) and root only; this \
             connection is from uid {peer}",
            socket.display()
        ),
        // No credentials to check on this platform: the socket's mode is the guard.
        Ok(None) => return None,
        Err(e) => format!(
            "the admin socket {} could not read the connection's credentials ({e}), so it \
             refuses it",
            socket.display()
        ),
    };
    REFUSED.fetch_add(1, Ordering::Relaxed);
    #[cfg(feature = "tracing")]
    tracing::warn!(socket = %socket.display(), %reason, "idemstore admin socket: connection refused");
    Some(reason)
}

/// Whether a connection from user `peer` is served by a store running as user `own`.
pub fn admits(peer: u32, own: u32) -> bool {
    peer == own || peer == 0
}

#[cfg(any(target_os = "linux", target_os = "android"))]
mod credentials {
    use std::io;
    use std::os::unix::net::UnixStream;

    /// The user of the process that connected (as it was when it connected) and the user
    /// this process runs as (its effective user: the owner of the files it creates).
    pub(super) fn peer_and_own(stream: &UnixStream) -> io::Result<Option<(u32, u32)>> {
        let peer = rustix::net::sockopt::socket_peercred(stream)?;
        Ok(Some((
            peer.uid.as_raw(),
            rustix::process::geteuid().as_raw(),
        )))
    }
}

/// Other Unix systems: the socket's mode (0600) and the private directory it is bound in are
/// the guard; no credentials are checked.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
mod credentials {
    use std::io;
    use std::os::unix::net::UnixStream;

    pub(super) fn peer_and_own(_: &UnixStream) -> io::Result<Option<(u32, u32)>> {
        Ok(None)
    }
}
