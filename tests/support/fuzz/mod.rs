//! Entry points for the fuzz targets in `fuzz/`, and the test that replays their corpus.
//!
//! Compiled into the integration tests (which replay the checked-in corpus) and into each
//! target of `fuzz/`. It opens stores on the simulated disk through the public storage seam and
//! reaches the few internals the targets need (the record and log-frame codecs, log recovery)
//! through the hidden `__whitebox` feature.
//!
//! Each entry point takes the fuzzer's bytes and runs them to the end. Errors from the store
//! are expected answers to hostile input and are ignored; a panic means a broken invariant and
//! is a finding. Inputs are bounded (steps, image sizes) so that one input never runs long.
//!
//! - [`decode`]: the record decoder, the frame header and payload decoders, and
//!   `Wal::recover` on a simulated disk holding the bytes.
//! - [`open`]: a store opened from a redb file image and a log image, raw or patched from a
//!   valid store, then used, closed and opened again.
//! - [`ops`]: a sequence of operations, clock steps, checkpoints, restarts, process crashes,
//!   power losses, injected I/O failures and full disks, checked against a reference model.

mod decode;
mod open;
mod ops;

use std::time::{Duration, UNIX_EPOCH};

use crate::support::sim::SimDisk;
use idemstore::{Builder, ManualClock, OpenError, Store};

pub use decode::decode;
pub use open::open;
pub use ops::ops;

/// Lease of the fuzzed stores, in milliseconds.
const LEASE_MS: u64 = 1_000;
/// Retention of the fuzzed stores, in milliseconds.
const RETENTION_MS: u64 = 5_000;
/// Where every fuzzed store's clock starts, so that runs are repeatable.
const START_MS: u64 = 1_700_000_000_000;

/// The fuzzer's bytes, read front to back; reads past the end give zeros.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    /// Up to `n` bytes (fewer at the end).
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, tail) = self.0.split_at(n.min(self.0.len()));
        self.0 = tail;
        head
    }

    fn rest(&mut self) -> &'a [u8] {
        self.take(self.0.len())
    }
}

/// The store configuration every target uses: a manual clock at [`START_MS`], short leases,
/// the smallest checkpoint size, small caches.
fn builder(clock: &ManualClock) -> Builder {
    let mut builder = Store::builder();
    builder
        .clock(clock.clone())
        .lease(Duration::from_millis(LEASE_MS))
        .retention(Duration::from_millis(RETENTION_MS))
        .checkpoint_bytes(64 * 1024)
        .checkpoint_interval(Duration::from_secs(3600))
        .cache_size(1 << 20)
        .cache_records(4)
        // Sweeps happen when an input asks for them, not when real time says.
        .sweep_interval(None);
    builder
}

fn clock() -> ManualClock {
    ManualClock::starting_at(UNIX_EPOCH + Duration::from_millis(START_MS))
}

/// Opens (creating if empty) a store on simulated disks: `Store::open_sim`, which refuses a
/// damaged image (redb's integrity check unless the image was closed cleanly, and a panic
/// inside redb caught) instead of panicking; reads of a damaged page the check did not see
/// return an error.
fn open_sim(builder: &Builder, db_disk: &SimDisk, log_disk: &SimDisk) -> Result<Store, OpenError> {
    builder.open_with_storage(db_disk.clone(), log_disk.clone())
}

/// Writes the hand-made seed inputs (`seed-*`) of every target into `fuzz/corpus/`, the base
/// images into `fuzz/bases/` and the known crashes into `fuzz/known-crashes/`, under `fuzz`
/// (the fuzz crate's folder): `cargo run --manifest-path fuzz/Cargo.toml --bin write_seeds`,
/// when the input formats change.
pub fn write_seeds(fuzz: &std::path::Path) {
    use std::fs;

    for (name, crashed) in [("clean", false), ("crashed", true)] {
        let (db, log) = open::base(crashed);
        fs::create_dir_all(fuzz.join("bases")).expect("create fuzz/bases");
        fs::write(fuzz.join(format!("bases/{name}.idem")), db).expect("write a base");
        fs::write(fuzz.join(format!("bases/{name}.idem.wal")), log).expect("write a base");
    }
    let root = fuzz.join("corpus");
    let write = |target: &str, name: &str, data: &[u8]| {
        let dir = root.join(target);
        fs::create_dir_all(&dir).expect("create the corpus directory");
        fs::write(dir.join(format!("seed-{name}")), data).expect("write a seed");
    };
    for (name, data) in decode::seeds() {
        write("decode", &name, &data);
    }
    for (name, data) in decode::known_crashes() {
        let dir = fuzz.join("known-crashes/decode");
        fs::create_dir_all(&dir).expect("create the known-crashes directory");
        fs::write(dir.join(name), data).expect("write a known crash");
    }
    for (name, data) in open::seeds() {
        write("open", &name, &data);
    }
    for (name, data) in ops::seeds() {
        write("ops", &name, &data);
    }
}

/// Runs one input through one target (`decode`, `open` or `ops`), for triage:
/// `cargo run --manifest-path fuzz/Cargo.toml --bin replay -- ops fuzz/artifacts/ops/crash-…`
/// (with `IDEMSTORE_FUZZ_TRACE=1`, the `ops` target prints every step).
///
/// # Errors
/// An unknown target.
pub fn replay(target: &str, data: &[u8]) -> Result<(), String> {
    match target {
        "decode" => decode(data),
        "open" => open(data),
        "ops" => ops(data),
        other => return Err(format!("unknown target {other}: decode, open or ops")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Replays every input checked in under `fuzz/corpus/<target>/` through the same entry
    //! points, so that a plain `cargo test` keeps every past finding fixed.

    use std::fs;
    use std::path::Path;

    /// A target's entry point.
    type Entry = fn(&[u8]);

    fn replay(target: &str, run: Entry) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/corpus")
            .join(target);
        let mut files: Vec<_> = fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|entry| entry.expect("directory entry").path())
            .collect();
        files.sort();
        assert!(
            files.len() >= 5,
            "{} holds only {} inputs",
            dir.display(),
            files.len()
        );
        for file in files {
            let data = fs::read(&file).expect("read a corpus file");
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(outcome.is_ok(), "corpus input {} fails", file.display());
        }
    }

    /// The seed writer's inputs run cleanly through their targets, and it writes a seed for
    /// every target and both base images (into a temporary folder, not the checked-in corpus).
    #[test]
    fn the_seed_writer_writes_inputs_that_run() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        super::write_seeds(dir.path());
        for target in ["decode", "open", "ops"] {
            let files: Vec<_> = fs::read_dir(dir.path().join("corpus").join(target))
                .expect("the seeds of a target")
                .map(|entry| entry.expect("directory entry").path())
                .collect();
            assert!(files.len() >= 3, "{target}: only {} seeds", files.len());
            for file in files {
                let data = fs::read(&file).expect("read a seed");
                let outcome = std::panic::catch_unwind(|| super::replay(target, &data));
                assert!(
                    matches!(outcome, Ok(Ok(()))),
                    "seed {} fails",
                    file.display()
                );
            }
        }
        assert!(super::replay("nothing", b"").is_err());
        for base in [
            "clean.idem",
            "clean.idem.wal",
            "crashed.idem",
            "crashed.idem.wal",
        ] {
            let len = fs::metadata(dir.path().join("bases").join(base))
                .expect("a base image")
                .len();
            assert!(len > 0, "base {base} is empty");
        }
    }

    /// Inputs under `fuzz/known-crashes/<target>/` still fail because of a bug outside the
    /// fuzz targets (each named in RELIABILITY.md). Once one passes, its bug is fixed: move
    /// the file into `fuzz/corpus/<target>/`.
    #[test]
    fn known_crashes_still_fail() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/known-crashes");
        let targets: [(&str, Entry); 3] = [
            ("decode", super::decode),
            ("open", super::open),
            ("ops", super::ops),
        ];
        // The folder is checked in (with its README), so a wrong path fails here instead of
        // checking nothing; so does a folder named after no target.
        let listed = fs::read_dir(&root)
            .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
            .map(|entry| entry.expect("directory entry").file_name())
            .collect::<Vec<_>>();
        for name in &listed {
            let name = name.to_string_lossy();
            assert!(
                name == "README.md" || targets.iter().any(|(target, _)| *target == name),
                "fuzz/known-crashes/{name} is no target's folder (decode, open, ops)"
            );
        }
        assert!(
            listed.iter().any(|name| name == "README.md"),
            "{} has no README.md: is it the right folder?",
            root.display()
        );
        for (target, run) in targets {
            let Ok(entries) = fs::read_dir(root.join(target)) else {
                continue;
            };
            for entry in entries {
                let file = entry.expect("directory entry").path();
                let data = fs::read(&file).expect("read a known crash");
                let outcome = std::panic::catch_unwind(|| run(&data));
                assert!(
                    outcome.is_err(),
                    "{} no longer fails: its bug is fixed, move it into fuzz/corpus/{target}/",
                    file.display()
                );
            }
        }
    }

    #[test]
    fn decode_corpus_replays() {
        replay("decode", super::decode);
    }

    #[test]
    fn open_corpus_replays() {
        replay("open", super::open);
    }

    #[test]
    fn ops_corpus_replays() {
        replay("ops", super::ops);
    }
}
