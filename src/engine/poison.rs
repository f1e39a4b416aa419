//! The latched first write failure: once a write or sync fails, every call fails with
//! [`Error::Poisoned`] until the store is reopened.

use std::sync::OnceLock;

use crate::error::Error;

/// The first write failure, latched: once set, every call fails.
#[derive(Debug, Default)]
pub(crate) struct Poison(OnceLock<(String, Option<std::io::ErrorKind>)>);

impl Poison {
    pub(crate) fn check(&self) -> Result<(), Error> {
        match self.0.get() {
            None => Ok(()),
            Some((cause, io_kind)) => Err(Error::Poisoned {
                cause: cause.clone(),
                io_kind: *io_kind,
            }),
        }
    }

    pub(crate) fn set(&self, error: &Error) {
        if self.0.set((error.to_string(), error.io_kind())).is_ok() {
            #[cfg(feature = "tracing")]
            tracing::error!(%error, "idemstore poisoned: refusing all further work until reopened");
        }
    }
}

/// Errors are not `Clone`: every caller of a failed batch gets `Poisoned` with the failure's
/// message and I/O error kind (so a full disk is recognizable with [`Error::io_kind`]).
pub(crate) fn error_copy(error: &Error) -> Error {
    match error {
        Error::Poisoned { cause, io_kind } => Error::Poisoned {
            cause: cause.clone(),
            io_kind: *io_kind,
        },
        other => Error::Poisoned {
            cause: other.to_string(),
            io_kind: other.io_kind(),
        },
    }
}
