//! Every kind of error prints each cause once: by its message or by `source()`, never both,
//! through the narrow types (`KeyError`, `OpenError`, `StorageError`) and the umbrella
//! `Error` they convert into.

use std::error::Error as _;
use std::path::PathBuf;

use idemstore::{Error, Key, KeyError, KeyPart, LeaseLostReason, OpenError, StorageError};

/// The message followed by each cause, `": "` between them (anyhow's `{:#}`).
fn chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        line = format!("{line}: {next}");
        cause = next.source();
    }
    line
}

/// Fails when a message repeats the message of its source: a reporter that walks `source()`
/// would print that cause twice.
#[track_caller]
fn each_cause_once(error: &dyn std::error::Error) {
    let mut outer = error;
    let mut depth = 0;
    while let Some(source) = outer.source() {
        let (message, cause) = (outer.to_string(), source.to_string());
        assert!(
            !message.contains(&cause),
            "{message:?} repeats its source {cause:?}"
        );
        (outer, depth) = (source, depth + 1);
    }
    assert!(depth < 8, "a chain of {depth} causes");
}

fn io() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::IsADirectory, "Is a directory")
}

fn storage_errors() -> Vec<StorageError> {
    vec![
        StorageError::Io {
            context: "reading store.idem".into(),
            source: io(),
        },
        StorageError::Redb {
            context: "compacting the store file",
            source: Box::new(redb::Error::Io(io())),
        },
        StorageError::Corruption {
            location: "record u/op/id".into(),
            reason: "checksum".into(),
        },
        StorageError::Poisoned {
            cause: "writing: Is a directory".into(),
            io_kind: None,
        },
    ]
}

fn open_errors() -> Vec<OpenError> {
    let path = || PathBuf::from("store.idem");
    let mut errors = vec![
        OpenError::InvalidConfig {
            setting: "lease",
            reason: "zero".into(),
        },
        OpenError::AlreadyOpen { path: path() },
        OpenError::NotAStore {
            path: path(),
            reason: "it is a directory".into(),
        },
        OpenError::ForeignLog {
            store: path(),
            log: path(),
            reason: "damaged".into(),
        },
        OpenError::LostLog {
            store: path(),
            log: path(),
            reason: "is missing".into(),
        },
    ];
    errors.extend(storage_errors().into_iter().map(OpenError::from));
    errors
}

fn umbrella_errors() -> Vec<Error> {
    let boxed = || -> Box<dyn std::error::Error + Send + Sync> { Box::new(io()) };
    let key = || Key::new("u", "op", "id").expect("a key");
    let mut errors = vec![
        Error::from(KeyError {
            part: KeyPart::Id,
            len: 0,
        }),
        Error::ResultTooLarge {
            key: key(),
            len: 2,
            limit: 1,
        },
        Error::NoteTooLarge {
            key: key(),
            len: 9000,
        },
        Error::LeaseLost {
            key: key(),
            token: 1,
            reason: LeaseLostReason::Gone,
        },
        Error::NotResolvable {
            key: key(),
            reason: "completed",
        },
        Error::LeaseLive {
            key: key(),
            lease_until: std::time::UNIX_EPOCH,
        },
        Error::Admin {
            socket: PathBuf::from("store.idem.sock"),
            message: "refused".into(),
        },
        Error::Callback { source: boxed() },
        Error::Cluster {
            context: "reserving u/op/id".into(),
            source: boxed(),
        },
        Error::Database {
            context: "reserving u/op/id".into(),
            source: boxed(),
        },
        Error::Reentrant,
    ];
    errors.extend(open_errors().into_iter().map(Error::from));
    errors.extend(storage_errors().into_iter().map(Error::from));
    errors
}

/// Each kind, alone and wrapped: each cause once, and a wrapped error reads as itself (the
/// same message, the same causes, the same I/O kind), so a converted error changes nothing a
/// reporter prints.
#[test]
fn every_error_kind_prints_each_cause_once() {
    for error in umbrella_errors() {
        each_cause_once(&error);
        if error.source().is_some() {
            assert!(chain(&error).ends_with("Is a directory"), "{error:?}");
        }
    }
    for (open, storage) in open_errors().into_iter().skip(5).zip(storage_errors()) {
        let (text, kind) = (chain(&storage), storage.io_kind());
        assert_eq!(
            chain(&open),
            text,
            "an OpenError wraps a StorageError as itself"
        );
        assert_eq!(open.io_kind(), kind);
        let error = Error::from(open);
        assert_eq!(chain(&error), text, "an Error wraps an OpenError as itself");
        assert_eq!(error.io_kind(), kind);
    }
    for open in open_errors() {
        let text = chain(&open);
        assert_eq!(chain(&Error::from(open)), text);
    }
}

/// The poisoned store's cause keeps the failure's whole chain as text, and its I/O kind.
#[test]
fn a_poisoned_store_keeps_the_chain_of_its_failure() {
    let failure = Error::from(StorageError::Io {
        context: "writing the log".into(),
        source: std::io::Error::new(std::io::ErrorKind::StorageFull, "No space left on device"),
    });
    let poisoned = idemstore::whitebox::poisoned_copy(&failure);
    assert!(
        poisoned
            .to_string()
            .contains("writing the log: No space left on device"),
        "{poisoned}"
    );
    assert_eq!(poisoned.io_kind(), Some(std::io::ErrorKind::StorageFull));
    assert!(matches!(
        poisoned,
        Error::Storage(StorageError::Poisoned { .. })
    ));
}
