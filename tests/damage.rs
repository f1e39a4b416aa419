//! The damaged-file sweep (issue 18): a store with thousands of completed and pending keys,
//! copied with one byte flipped (at every 4 KiB page of the store file and at random offsets
//! of its log), each copy opened, every key read back and reserved again, in a CHILD process
//! (this test binary, re-run with an environment variable), so that an abort is counted rather
//! than fatal. Each copy ends as one of:
//!
//! - `ok`: every key answered as stored (a pending key: still in progress, or taken over
//!   with attempt 2);
//! - `error`: an error naming the damaged file (the open, or the read that met the damage)
//!   or the key of a damaged record;
//! - `wrong`: an answer without an error that differs from what was stored (a completed key
//!   read as absent, or acquired afresh: the work would run twice);
//! - `panic`: a panic, even one the store caught and turned into an error;
//! - `abort`: the child died (a signal, an abort in a destructor);
//! - `hang`: no answer within 60 s.
//!
//! Wrong answers, panics, aborts, hangs, and errors that name neither file nor a key, must
//! be zero.
//! Four times: after a clean close; after an unclean shutdown (the files as a killed process
//! leaves them, with frames in the log past the last checkpoint); and twice after an unclean
//! shutdown with both of the log's regions live (killed while a background checkpoint's
//! durable commit was held: the store file still names the region the checkpoint covers,
//! whose frames end where the writer moved to the other, which holds the frames written
//! since), once with the other region after the first in the file and once with the frames
//! gone back to the log's start (the checkpoint before moved them past it). Copy 0 of each
//! sweep is the undamaged store, which must answer every key as stored. In the unclean
//! cases every key is checked, also the one in the last frame written before the kill (its
//! spare copy stands in for it when it is damaged), and some of the flips land in the log's
//! last two frames; with two regions, some also land in the first region's last frames and
//! in the second region's first ones.
//!
//! Under `cargo test` (a debug build, a smoke run): 6 random pages of the store file, 6
//! offsets of the log and (unclean) 2 in each of those frame ranges. In a release build (CI's
//! `release` step): every page of the store file once, 64 offsets of the log and 32 in each
//! range. `IDEMSTORE_LONG=1`: every page at 8 offsets, 1,000 offsets of the log and 200 in
//! each range.
//! `IDEMSTORE_DAMAGE_SEED=<n>` repeats a run's choice of offsets (the seed is printed).

use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idemstore::{Builder, Fingerprint, Key, Reservation, Status, Store};

/// Set in the child: `<pristine dir> <spec file>`.
const CHILD_ENV: &str = "IDEMSTORE_DAMAGE_CHILD";
const COMPLETED: usize = 1500;
const PENDING: usize = 500;
/// Keys completed after the last checkpoint in the unclean case (only in the log).
const LOGGED: usize = 100;
const PAGE: u64 = 4096;

fn log_of(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".wal");
    PathBuf::from(name)
}

fn builder() -> Builder {
    let mut builder = Store::builder();
    builder
        .lease(Duration::from_secs(3600))
        .sweep_interval(None)
        .checkpoint_bytes(64 * 1024)
        .checkpoint_interval(Duration::from_secs(3600))
        .preallocate_log(true)
        .cache_size(1 << 20);
    builder
}

fn completed_key(i: usize) -> Key {
    Key::new("tenant", "charge", format!("done-{i:05}")).unwrap()
}

fn pending_key(i: usize) -> Key {
    Key::new("tenant", "charge", format!("open-{i:05}")).unwrap()
}

fn result_of(i: usize) -> Vec<u8> {
    format!("receipt {i}").into_bytes()
}

fn request() -> Fingerprint {
    Fingerprint::of(b"amount=100")
}

/// How the pristine store is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Closed cleanly.
    Clean,
    /// Killed with frames in the log past the last checkpoint.
    Unclean,
    /// Killed while a background checkpoint's commit was held: frames in both log regions
    /// (the second one after the first in the file).
    Regions,
    /// The same a checkpoint later: the store file names the region after the first, and
    /// the frames written since went back to the start of the log.
    RegionsWrapped,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::Clean => "clean",
            Kind::Unclean => "unclean",
            Kind::Regions => "regions",
            Kind::RegionsWrapped => "regions wrapped",
        }
    }
}

/// The byte range of the log that `write` changes.
fn changed_by(log: &Path, write: impl FnOnce()) -> (usize, usize) {
    let before = fs::read(log).unwrap();
    write();
    let after = fs::read(log).unwrap();
    // Blocks compared whole first (a debug build compares a slice as fast as a release one,
    // byte by byte it is slow), then bytes in the first and last blocks that differ.
    const BLOCK: usize = 4096;
    let differs = |i: usize| before.get(i) != Some(&after[i]);
    let block_differs = |b: usize| {
        let range = b * BLOCK..((b + 1) * BLOCK).min(after.len());
        before.get(range.clone()) != Some(&after[range])
    };
    let blocks = after.len().div_ceil(BLOCK);
    let first = (0..blocks)
        .find(|&b| block_differs(b))
        .expect("the log changed");
    let last = (0..blocks).rev().find(|&b| block_differs(b)).unwrap();
    let start = (first * BLOCK..).find(|&i| differs(i)).unwrap();
    let end = ((last * BLOCK)..((last + 1) * BLOCK).min(after.len()))
        .rev()
        .find(|&i| differs(i))
        .unwrap();
    (start, end + 1)
}

/// Builds the store in `dir` and leaves it closed cleanly, or as a killed process leaves it.
/// Writes there how many completed keys it holds (`completed`) and the log's byte ranges the
/// sweep aims at besides its random offsets (`targets`, a `first end` per line).
fn build(dir: &Path, kind: Kind) {
    let scratch = tempfile::tempdir().unwrap();
    let path = scratch.path().join("store.idem");
    let store = builder().open(&path).unwrap();
    let complete = |keys: Vec<(usize, Key)>| {
        let items: Vec<_> = keys.iter().map(|(_, k)| (k.clone(), request())).collect();
        let answers = store.reserve_many(&items).unwrap();
        let leases: Vec<_> = answers
            .into_iter()
            .zip(&keys)
            .map(|(answer, (i, _))| match answer.unwrap() {
                Reservation::Acquired(lease) => (lease, result_of(*i)),
                other => panic!("a fresh key answered {other:?}"),
            })
            .collect();
        // One batch (one frame, one sync) for a chunk, one each for a single key.
        let completions = leases.iter().map(|(lease, result)| (lease, result.clone()));
        for answer in store.complete_many(completions.collect()).unwrap() {
            answer.unwrap();
        }
    };
    for chunk in (0..COMPLETED).collect::<Vec<_>>().chunks(250) {
        complete(chunk.iter().map(|&i| (i, completed_key(i))).collect());
    }
    let pending: Vec<_> = (0..PENDING).map(|i| (pending_key(i), request())).collect();
    for answer in store.reserve_many(&pending).unwrap() {
        assert!(matches!(answer.unwrap(), Reservation::Acquired(_)));
    }
    let target = dir.join("store.idem");
    let mut targets = Vec::new();
    let mut next = COMPLETED;
    let mut release = None;
    if matches!(kind, Kind::Regions | Kind::RegionsWrapped) {
        // Frames in the first region until a background checkpoint starts (held before its
        // commit); the last completion before it is the first region's last frames, the
        // first one after it the second region's first frames. Wrapped: one background
        // checkpoint first (not held), so that the held one sends the frames back to the
        // first region.
        store.checkpoint().unwrap();
        if kind == Kind::RegionsWrapped {
            let (entered_tx, entered) = mpsc::channel();
            store.__before_checkpoint_commit(move || {
                let _ = entered_tx.send(());
            });
            while entered.recv_timeout(Duration::from_millis(1)).is_err() {
                assert!(next < COMPLETED + 5_000, "no background checkpoint started");
                complete(vec![(next, completed_key(next))]);
                next += 1;
            }
        }
        let (entered_tx, entered) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        store.__before_checkpoint_commit(move || {
            let _ = entered_tx.send(());
            let _ = release_rx.recv();
        });
        release = Some(release_tx);
        // The completions' log ranges, in order. The hook tells of the switch a little after
        // it (it runs on the checkpoint's thread): a completion or two may land in the new
        // region before the loop sees it, so the switch is found in the ranges.
        let mut ranges = Vec::new();
        while entered.recv_timeout(Duration::from_millis(1)).is_err() {
            assert!(next < COMPLETED + 5_000, "no background checkpoint started");
            let i = next;
            ranges.push(changed_by(&log_of(&path), || {
                complete(vec![(i, completed_key(i))])
            }));
            next += 1;
        }
        let i = next;
        ranges.push(changed_by(&log_of(&path), || {
            complete(vec![(i, completed_key(i))])
        }));
        next += 1;
        let (last_before, first_after) = if kind == Kind::RegionsWrapped {
            // The frames went back to the log's start: the first range that starts before
            // the one ahead of it.
            let at = (1..ranges.len())
                .find(|&n| ranges[n].0 < ranges[n - 1].0)
                .unwrap_or_else(|| panic!("the frames never went back to the start: {ranges:?}"));
            (ranges[at - 1], ranges[at])
        } else {
            // The second region follows the first in the file: the switch is among the last
            // ranges, which lie next to each other.
            let n = ranges.len();
            assert!(n >= 2, "frames before the switch");
            assert!(
                ranges.windows(2).all(|w| w[1].0 > w[0].0),
                "the frames went back in the file: {ranges:?}"
            );
            (ranges[n - 2], ranges[n - 1])
        };
        targets.extend([last_before, first_after]);
    }
    if kind != Kind::Clean {
        if kind == Kind::Unclean {
            store.checkpoint().unwrap();
        }
        for i in next..next + LOGGED - 1 {
            complete(vec![(i, completed_key(i))]);
        }
        // The last two frames (the last key's reserve and its completion, the last one
        // written before the kill) are where the log changed since this image.
        let last = next + LOGGED - 1;
        targets.push(changed_by(&log_of(&path), || {
            complete(vec![(last, completed_key(last))])
        }));
        next = last + 1;
        // What a kill leaves: every write the process made.
        fs::copy(&path, &target).unwrap();
        fs::copy(log_of(&path), log_of(&target)).unwrap();
        drop(release);
        drop(store);
    } else {
        drop(store);
        fs::copy(&path, &target).unwrap();
        fs::copy(log_of(&path), log_of(&target)).unwrap();
    }
    fs::write(dir.join("completed"), next.to_string()).unwrap();
    let targets: String = targets
        .iter()
        .map(|(first, end)| format!("{first} {end}\n"))
        .collect();
    fs::write(dir.join("targets"), targets).unwrap();
}

/// How one damaged copy ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Outcome {
    Ok,
    Error,
    Wrong,
    Panic,
    Abort,
    Hang,
    /// An error that names neither file nor a key.
    Vague,
}

impl Outcome {
    fn parse(word: &str) -> Outcome {
        match word {
            "ok" => Outcome::Ok,
            "error" => Outcome::Error,
            "wrong" => Outcome::Wrong,
            "panic" => Outcome::Panic,
            "vague" => Outcome::Vague,
            other => panic!("unknown outcome {other}"),
        }
    }
}

/// One copy, in the child: opens it, reads every key back and reserves it again.
fn check_copy(path: &Path, completed: usize) -> (Outcome, String) {
    let named = |e: &idemstore::Error| {
        let text = e.to_string();
        // The file, or the key of a damaged record.
        let outcome = if text.contains("store.idem") || text.contains("in record ") {
            Outcome::Error
        } else {
            Outcome::Vague
        };
        (outcome, text)
    };
    let store = match builder().open(path) {
        Ok(store) => store,
        Err(e) => return named(&e.into()),
    };
    let mut first_error = None;
    let mut note = |e: idemstore::Error| {
        if first_error.is_none() {
            first_error = Some(named(&e));
        }
    };
    for i in 0..completed {
        match store.get(&completed_key(i)) {
            Ok(Some(record)) => match record.status() {
                Status::Completed { result, .. } if result == result_of(i).as_slice() => {}
                other => return (Outcome::Wrong, format!("done-{i} reads as {other:?}")),
            },
            Ok(None) => return (Outcome::Wrong, format!("done-{i} reads as absent")),
            Err(e) => note(e),
        }
    }
    for i in 0..PENDING {
        match store.get(&pending_key(i)) {
            Ok(Some(record)) if matches!(record.status(), Status::Pending { .. }) => {}
            Ok(other) => return (Outcome::Wrong, format!("open-{i} reads as {other:?}")),
            Err(e) => note(e),
        }
    }
    let items: Vec<_> = (0..completed)
        .map(|i| (completed_key(i), request()))
        .chain((0..PENDING).map(|i| (pending_key(i), request())))
        .collect();
    match store.reserve_many(&items) {
        Ok(answers) => {
            for ((key, _), answer) in items.iter().zip(answers) {
                let done = key.id().starts_with(b"done-");
                match answer {
                    Ok(Reservation::Completed(c)) if done => {
                        let i: usize = String::from_utf8_lossy(&key.id()[5..]).parse().unwrap();
                        if c.result != result_of(i) {
                            return (Outcome::Wrong, format!("{key} replays another result"));
                        }
                    }
                    // A pending key is still in progress (its owner closed the store) or taken
                    // over (its owner died): attempt 2, never a fresh attempt 1.
                    Ok(Reservation::Acquired(lease)) if !done && lease.attempt() > 1 => {}
                    Ok(Reservation::InProgress { .. }) if !done => {}
                    Ok(other) => return (Outcome::Wrong, format!("{key} answered {other:?}")),
                    Err(e) => note(e),
                }
            }
        }
        Err(e) => note(e),
    }
    drop(store);
    first_error.unwrap_or((Outcome::Ok, String::new()))
}

/// The child's side: does nothing unless started by [`sweep`].
#[test]
fn child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.split(' ');
    let pristine = PathBuf::from(parts.next().expect("pristine dir"));
    let flips = PathBuf::from(parts.next().expect("spec file"));
    let completed: usize = fs::read_to_string(pristine.join("completed"))
        .unwrap()
        .parse()
        .unwrap();
    std::panic::set_hook(Box::new(|info| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "panic {}", info.to_string().replace('\n', " "));
        let _ = out.flush();
    }));
    let work = tempfile::tempdir().unwrap();
    let path = work.path().join("store.idem");
    let store_image = fs::read(pristine.join("store.idem")).unwrap();
    let log_image = fs::read(log_of(&pristine.join("store.idem"))).unwrap();
    for line in fs::read_to_string(&flips).unwrap().lines() {
        let mut fields = line.split(' ');
        let (n, file, offset, xor) = (
            fields.next().unwrap(),
            fields.next().unwrap(),
            fields.next().unwrap().parse::<usize>().unwrap(),
            fields.next().unwrap().parse::<u8>().unwrap(),
        );
        let (mut store_copy, mut log_copy) = (store_image.clone(), log_image.clone());
        match file {
            "store" => store_copy[offset] ^= xor,
            _ => log_copy[offset] ^= xor,
        }
        fs::write(&path, &store_copy).unwrap();
        fs::write(log_of(&path), &log_copy).unwrap();
        println!("start {n}");
        let (outcome, detail) = check_copy(&path, completed);
        let word = format!("{outcome:?}").to_lowercase();
        println!("done {n} {word} {}", detail.replace('\n', " "));
        std::io::stdout().flush().unwrap();
    }
}

/// A deterministic generator for the offsets.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// The length of the log's frames (past it the preallocated log holds zeros).
fn used_len(log: &[u8]) -> u64 {
    log.iter()
        .rposition(|&b| b != 0)
        .map_or(0, |p| p as u64 + 1)
}

/// Runs the sweep over the store built by `build(.., unclean)`; returns the counts.
fn sweep(kind: Kind) -> std::collections::BTreeMap<Outcome, usize> {
    let seed = std::env::var("IDEMSTORE_DAMAGE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    println!(
        "damage sweep ({}): IDEMSTORE_DAMAGE_SEED={seed}",
        kind.word()
    );
    let mut rng = Rng(seed);
    let pristine = tempfile::tempdir().unwrap();
    build(pristine.path(), kind);
    let store_len = fs::metadata(pristine.path().join("store.idem"))
        .unwrap()
        .len();
    let log = fs::read(log_of(&pristine.path().join("store.idem"))).unwrap();
    let log_used = used_len(&log).max(64);
    // Pages of the store file (`None`: every page), flips per page, flips in the log and in
    // each of the log's target ranges.
    let (pages, per_page, log_flips, per_range) =
        crate::common::by_mode((Some(6), 1, 6, 2), (None, 1, 64, 32), (None, 8, 1000, 200));
    // Copy 0 is the undamaged store (xor 0): it must answer every key as stored, or a
    // sweep where every copy fails to open would pass.
    let mut flips = vec![("log", 0)];
    let store_pages = store_len / PAGE;
    let pages: Vec<u64> = match pages {
        None => (0..store_pages).collect(),
        Some(n) => (0..n).map(|_| rng.below(store_pages)).collect(),
    };
    for page in pages {
        for _ in 0..per_page {
            flips.push(("store", page * PAGE + rng.below(PAGE)));
        }
    }
    for _ in 0..log_flips {
        flips.push(("log", rng.below(log_used)));
    }
    for range in fs::read_to_string(pristine.path().join("targets"))
        .unwrap()
        .lines()
    {
        let (first, end) = range.split_once(' ').unwrap();
        let (first, end): (u64, u64) = (first.parse().unwrap(), end.parse().unwrap());
        for _ in 0..per_range {
            flips.push(("log", first + rng.below(end - first)));
        }
    }
    let mut spec = String::new();
    for (n, (file, offset)) in flips.iter().enumerate() {
        let xor = if n == 0 { 0 } else { 1 + rng.below(255) as u8 };
        writeln!(spec, "{n} {file} {offset} {xor}").unwrap();
    }
    let mut counts = std::collections::BTreeMap::new();
    let mut bad = Vec::new();
    let mut next = 0;
    while next < flips.len() {
        let spec_path = pristine.path().join("spec");
        let rest: String = spec.lines().skip(next).map(|l| format!("{l}\n")).collect();
        fs::write(&spec_path, rest).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "damage::child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                CHILD_ENV,
                format!("{} {}", pristine.path().display(), spec_path.display()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if tx.send(line.unwrap_or_default()).is_err() {
                    break;
                }
            }
        });
        let mut current: Option<usize> = None;
        let mut panicked = false;
        let ended = loop {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(line) if line.starts_with("start ") => {
                    current = Some(line[6..].parse().unwrap());
                    panicked = false;
                }
                Ok(line) if line.starts_with("panic ") => {
                    panicked = true;
                    bad.push(format!("{:?}: {line}", current.map(|n| flips[n])));
                }
                Ok(line) if line.starts_with("done ") => {
                    let mut fields = line.splitn(4, ' ');
                    let n: usize = fields.nth(1).unwrap().parse().unwrap();
                    let mut outcome = Outcome::parse(fields.next().unwrap());
                    if panicked {
                        outcome = Outcome::Panic;
                    }
                    if n == 0 && outcome != Outcome::Ok {
                        bad.push(format!("the undamaged store: {line}"));
                    }
                    if !matches!(outcome, Outcome::Ok | Outcome::Error) {
                        bad.push(format!("{:?}: {line}", flips[n]));
                    }
                    *counts.entry(outcome).or_insert(0) += 1;
                    next = n + 1;
                    current = None;
                }
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    break Outcome::Hang;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break Outcome::Abort,
            }
        };
        let status = child.wait().unwrap();
        if let Some(n) = current {
            // The child died (or hung) on copy n.
            let outcome = if ended == Outcome::Hang {
                Outcome::Hang
            } else if panicked {
                Outcome::Panic
            } else {
                Outcome::Abort
            };
            bad.push(format!("{:?}: {outcome:?} ({status})", flips[n]));
            *counts.entry(outcome).or_insert(0) += 1;
            next = n + 1;
        } else if !status.success() {
            panic!("the child failed outside any copy: {status}");
        }
    }
    println!(
        "damage sweep ({}): {} copies: {counts:?}",
        kind.word(),
        flips.len()
    );
    for line in bad.iter().take(20) {
        println!("  {line}");
    }
    assert!(
        bad.is_empty(),
        "{} damaged copies gave a wrong answer, a panic, an abort, a hang or an error naming neither file: {counts:?}\n{}",
        bad.len(),
        bad.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
    assert_eq!(counts.values().sum::<usize>(), flips.len());
    counts
}

/// Runs the sweep of `kind` (unless this process is a child) and checks that some damage was
/// noticed.
fn sweep_noticing_damage(kind: Kind) {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let counts = sweep(kind);
    assert!(
        counts.get(&Outcome::Error).copied().unwrap_or(0) > 0,
        "no damage was noticed at all: {counts:?}"
    );
}

#[test]
fn damaged_copies_of_a_cleanly_closed_store_never_answer_wrongly() {
    sweep_noticing_damage(Kind::Clean);
}

#[test]
fn damaged_copies_after_an_unclean_shutdown_never_answer_wrongly() {
    sweep_noticing_damage(Kind::Unclean);
}

#[test]
fn damaged_copies_with_both_log_regions_live_never_answer_wrongly() {
    sweep_noticing_damage(Kind::Regions);
}

#[test]
fn damaged_copies_with_the_log_wrapped_to_its_start_never_answer_wrongly() {
    sweep_noticing_damage(Kind::RegionsWrapped);
}
