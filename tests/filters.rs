//! The windows' saved filters and the meta that describes them (docs/format.md, "Filters" and
//! "Meta keys"): rows are read only under the hash and seed the store records, a row that is
//! damaged, hostile or of another hash is rebuilt from its window's keys, a store of the
//! format as first released (foldhash rows, no hash identity) opens with every key, and a
//! store of the format whose windows were all one width is converted when opened; and a
//! filter alone: its saved form read back, damaged and hostile rows refused, and its hash.

use std::time::{Duration, UNIX_EPOCH};

use idemstore::redb::{ReadableDatabase, ReadableTable, TableDefinition};
use idemstore::whitebox::filter::{self, Filter, MIN_CAPACITY};
use idemstore::{Key, ManualClock, OpenError, Reservation, Store};

use crate::common::{fp, key, Env};

const META: TableDefinition<&str, u64> = TableDefinition::new("idemstore.meta");
const FILTERS: TableDefinition<u64, &[u8]> = TableDefinition::new("idemstore.filters");
/// The meta keys of the filters' hash and seed, absent from a store of the first format.
const HASH_META: [&str; 3] = ["filter_hash", "filter_seed_0", "filter_seed_1"];

/// Keys completed over 3 s of the environment's clock (5 s retention: windows of 256 ms, the
/// largest power of two at most a 16th of it), so they fill about a dozen windows.
const KEYS: usize = 60;

fn nth(i: usize) -> Key {
    key("t", "op", &format!("k-{i}"))
}

/// A store with [`KEYS`] completed keys, closed cleanly (its filters saved).
fn filled() -> Env {
    let env = Env::new();
    let store = env.open();
    for i in 0..KEYS {
        match store.reserve(&nth(i), fp("r")).unwrap() {
            Reservation::Acquired(lease) => store.complete(&lease, b"done".to_vec()).unwrap(),
            other => panic!("{}: {other:?}", nth(i)),
        }
        env.advance(Duration::from_millis(50));
    }
    drop(store);
    env
}

/// Opens the store and checks that every key of [`filled`] is found and that `verify` finds
/// each in its window's filter; returns the store.
fn finds_every_key(env: &Env) -> Store {
    let store = env.open();
    for i in 0..KEYS {
        assert!(store.get(&nth(i)).unwrap().is_some(), "{} lost", nth(i));
    }
    let report = store.verify().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    store
}

/// The CRC-32 (IEEE) a saved filter row ends with, computed here from its definition.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// The saved filter rows of the closed store at `env`.
fn rows(env: &Env) -> Vec<(u64, Vec<u8>)> {
    let db = idemstore::open_redb(&env.path).unwrap();
    let txn = db.begin_read().unwrap();
    let table = txn.open_table(FILTERS).unwrap();
    let rows = table
        .iter()
        .unwrap()
        .map(|row| {
            let (window, bytes) = row.unwrap();
            (window.value(), bytes.value().to_vec())
        })
        .collect();
    rows
}

/// Rewrites every saved filter row of the closed store at `env` with `change`, and the meta
/// table with `meta`, with redb directly.
fn rewrite(
    env: &Env,
    mut change: impl FnMut(&mut Vec<u8>),
    meta: impl FnOnce(&mut idemstore::redb::Table<&str, u64>),
) {
    let before = rows(env);
    assert!(
        before.len() >= 10,
        "the store saved its filters: {before:?}"
    );
    let db = idemstore::open_redb(&env.path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut table = txn.open_table(FILTERS).unwrap();
        for (window, mut bytes) in before {
            change(&mut bytes);
            table.insert(window, bytes.as_slice()).unwrap();
        }
        meta(&mut txn.open_table(META).unwrap());
    }
    txn.commit().unwrap();
}

/// A row's parts as (offset of the part's header, number of 512-bit blocks).
fn parts(row: &[u8]) -> Vec<(usize, usize)> {
    let mut at = 2;
    let mut parts = Vec::new();
    for _ in 0..row[1] {
        let blocks = u64::from_le_bytes(row[at + 16..at + 24].try_into().unwrap()) as usize;
        parts.push((at, blocks));
        at += 24 + blocks * 64;
    }
    parts
}

/// Clears every bit of a row's filter, keeping its layout: a filter that holds none of the
/// window's keys, as a row written with another hash (or seed) reads to this build.
fn clear_bits(row: &mut [u8]) {
    for (at, blocks) in parts(row) {
        row[at + 24..at + 24 + blocks * 64].fill(0);
    }
}

/// `row` with its CRC-32 recomputed, as a row that was written so reads.
fn reseal(row: &mut [u8]) {
    let len = row.len() - 4;
    let sum = crc32(&row[..len]);
    row[len..].copy_from_slice(&sum.to_le_bytes());
}

/// The meta value `name` of the closed store at `env`.
fn meta(env: &Env, name: &str) -> Option<u64> {
    let db = idemstore::open_redb(&env.path).unwrap();
    let txn = db.begin_read().unwrap();
    let table = txn.open_table(META).unwrap();
    let value = table.get(name).unwrap().map(|v| v.value());
    value
}

/// Every saved row as this build writes it: version 2, its CRC-32 last.
fn rows_are_current(env: &Env) {
    let rows = rows(env);
    assert!(!rows.is_empty());
    for (window, row) in rows {
        let (body, sum) = row.split_at(row.len() - 4);
        assert_eq!(body[0], 2, "window {window}: version");
        assert_eq!(crc32(body).to_le_bytes(), sum, "window {window}: CRC-32");
    }
}

/// A store whose meta table does not name the filters' hash (as a store of the first format
/// has none) has its saved rows ignored, even rows that read well: here every row holds no
/// key, as rows of another hash read. Each window's filter is built from its keys, the store
/// gets a seed and the hash's identity, and the next close saves rows under them.
#[test]
fn rows_without_the_hash_identity_are_rebuilt_from_the_keys() {
    let env = filled();
    let seed = meta(&env, "filter_seed_0");
    assert!(seed.is_some(), "a new store has a seed");
    rewrite(
        &env,
        |row| {
            clear_bits(row);
            reseal(row);
        },
        |meta| {
            for name in HASH_META {
                meta.remove(name).unwrap();
            }
        },
    );
    drop(finds_every_key(&env));
    assert_eq!(meta(&env, "filter_hash"), Some(1));
    assert!(meta(&env, "filter_seed_0").is_some_and(|s| Some(s) != seed));
    rows_are_current(&env);
    drop(finds_every_key(&env));
}

/// A store of the first released format (no hash identity, version-1 rows hashed by
/// foldhash, no CRC) opens with every key: here its rows as that build wrote them, but
/// holding no key under this build's hash. A store written later by this build and opened by
/// that one again (identity kept, version-1 rows) reads the same.
#[test]
fn a_store_of_the_first_format_opens_with_every_key() {
    for identity_kept in [false, true] {
        let env = filled();
        rewrite(
            &env,
            |row| {
                clear_bits(row);
                row.truncate(row.len() - 4);
                row[0] = 1;
            },
            |meta| {
                if !identity_kept {
                    for name in HASH_META {
                        meta.remove(name).unwrap();
                    }
                }
            },
        );
        drop(finds_every_key(&env));
        rows_are_current(&env);
    }
}

/// The fixture of the current format's store (`tests/fixtures/unclean`, written by the build
/// of the first format: foldhash rows, no hash identity) opens with every key, and gets the
/// filters' hash identity.
#[test]
fn the_fixture_of_the_first_format_gets_the_hash_identity() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/unclean");
    let env = Env::new();
    std::fs::copy(fixture.join("store.idem"), &env.path).unwrap();
    std::fs::copy(
        fixture.join("store.idem.wal"),
        env.dir.path().join("store.idem.wal"),
    )
    .unwrap();
    assert_eq!(
        meta(&env, "filter_hash"),
        None,
        "the fixture is of the first format"
    );
    let clock = ManualClock::starting_at(UNIX_EPOCH + Duration::from_millis(1_796_428_801_021));
    let store = Store::builder()
        .clock(clock)
        .sweep_interval(None)
        .open(&env.path)
        .unwrap();
    for prefix in ["before", "logged"] {
        for i in 0..10 {
            let k = Key::new("fixture", "op", format!("{prefix}-{i}")).unwrap();
            assert!(store.get(&k).unwrap().is_some(), "{k} lost");
        }
    }
    drop(store);
    assert_eq!(meta(&env, "filter_hash"), Some(1));
    rows_are_current(&env);
}

/// A row changed in place (here every bit of its filter cleared, so it would answer "absent"
/// for every key) fails its CRC-32 and is rebuilt from the window's keys; the open does not
/// fail.
#[test]
fn a_damaged_row_is_rebuilt_from_the_keys() {
    let env = filled();
    rewrite(&env, |row| clear_bits(row), |_| {});
    drop(finds_every_key(&env));
    rows_are_current(&env);
}

/// A row whose CRC-32 matches but whose counts are not what the store writes (a count of keys
/// of 2^40, which would size the next new window's filter at terabytes; a part that claims more
/// blocks than the row holds) is refused without a panic or a large allocation, and rebuilt;
/// the store then writes into new windows as usual.
#[test]
fn hostile_rows_are_rebuilt_and_size_nothing() {
    let env = filled();
    let mut n = 0;
    rewrite(
        &env,
        |row| {
            let (at, _) = parts(row)[0];
            let field = if n % 2 == 0 { at + 8 } else { at + 16 };
            row[field..field + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
            reseal(row);
            n += 1;
        },
        |_| {},
    );
    let store = finds_every_key(&env);
    // New keys in new windows: their filters are sized from the largest window's count.
    env.advance(Duration::from_secs(2));
    for i in 0..20 {
        let k = key("t", "op", &format!("new-{i}"));
        match store.reserve(&k, fp("r")).unwrap() {
            Reservation::Acquired(lease) => store.complete(&lease, b"done".to_vec()).unwrap(),
            other => panic!("{k}: {other:?}"),
        }
        env.advance(Duration::from_millis(100));
    }
    drop(store);
    rows_are_current(&env);
}

/// A filters table that cannot be opened (here one of another type, as a tool or a bug could
/// leave) does not fail the open: it is replaced, every window's filter is built from its
/// keys, and the store writes and saves its filters as usual.
#[test]
fn a_filters_table_that_cannot_be_read_is_replaced() {
    let env = filled();
    {
        let db = idemstore::open_redb(&env.path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.delete_table(FILTERS).unwrap();
        let other: TableDefinition<&str, &str> = TableDefinition::new("idemstore.filters");
        txn.open_table(other)
            .unwrap()
            .insert("not", "a filter")
            .unwrap();
        txn.commit().unwrap();
    }
    let store = finds_every_key(&env);
    let k = key("t", "op", "after");
    match store.reserve(&k, fp("r")).unwrap() {
        Reservation::Acquired(lease) => store.complete(&lease, b"done".to_vec()).unwrap(),
        other => panic!("{k}: {other:?}"),
    }
    store.checkpoint().unwrap();
    drop(store);
    rows_are_current(&env);
    let store = finds_every_key(&env);
    assert!(store.get(&k).unwrap().is_some());
}

/// A new store keeps no width of its windows (`window_ms`, of the format before): its windows'
/// widths come from each record's horizon. A store of that format (format 4, its records in
/// tables of one width) is converted when opened: every key is found in a window holding its
/// expiry, `verify` finds nothing wrong, and the file is of the current format, without
/// `window_ms`.
#[test]
fn a_store_of_the_format_with_one_window_width_is_converted_when_opened() {
    let env = filled();
    assert_eq!(meta(&env, "window_ms"), None, "no width");
    assert_eq!(meta(&env, "format"), Some(5));
    assert_eq!(meta(&env, "filter_hash"), Some(1));
    // Made a format-4 store: every record moved to the table of its window of 156 ms.
    let width = 5_000 / 32;
    {
        let db = idemstore::open_redb(&env.path).unwrap();
        let txn = db.begin_write().unwrap();
        let names = crate::common::records_tables(txn.list_tables().unwrap());
        let mut records = Vec::new();
        for name in &names {
            let table = txn.open_table(crate::common::records_table(name)).unwrap();
            for entry in table.iter().unwrap() {
                let (k, v) = entry.unwrap();
                records.push((k.value().to_vec(), v.value().to_vec()));
            }
        }
        for name in &names {
            txn.delete_table(crate::common::records_table(name))
                .unwrap();
        }
        for (k, v) in &records {
            let record = idemstore::whitebox::decode_record(v).unwrap();
            let expires_at = idemstore::whitebox::to_millis(record.expires_at().unwrap());
            let name = format!("idemstore.records.{:016x}", expires_at / width);
            txn.open_table(crate::common::records_table(&name))
                .unwrap()
                .insert(k.as_slice(), v.as_slice())
                .unwrap();
        }
        txn.delete_table(FILTERS).unwrap();
        let mut meta = txn.open_table(META).unwrap();
        meta.insert("format", 4).unwrap();
        meta.insert("window_ms", width).unwrap();
        drop(meta);
        txn.commit().unwrap();
    }
    // A read-only inspection cannot convert it: refused by name, the file untouched.
    let bytes = std::fs::read(&env.path).unwrap();
    let refused = idemstore::ReadOnlyStore::open(&env.path).unwrap_err();
    assert!(
        matches!(
            refused,
            OpenError::InvalidConfig {
                setting: "open_read_only",
                ..
            }
        ),
        "{refused:?}"
    );
    let message = refused.to_string();
    assert!(message.contains("earlier format"), "{message}");
    assert!(
        message.contains(&env.path.display().to_string()),
        "{message}"
    );
    assert!(
        std::fs::read(&env.path).unwrap() == bytes,
        "a read-only open wrote"
    );
    drop(finds_every_key(&env));
    assert_eq!(meta(&env, "format"), Some(5), "converted");
    assert_eq!(meta(&env, "window_ms"), None);
    rows_are_current(&env);
    drop(finds_every_key(&env));
}

/// A record written with a stale idea of where the key was stored (its old record in a window
/// that was deleted and made again since: a record cache still holding a deleted window's
/// record, or a clock stepped back) still goes into the new window's filter, so it is found,
/// also after the filters are saved and read back.
#[test]
fn a_record_put_over_a_stale_old_record_is_found() {
    use idemstore::whitebox::Tree;
    let at = 10_500;
    let mut tree = Tree::new(&ManualClock::starting_at(UNIX_EPOCH)).unwrap();
    tree.put(b"\x01t\x02op\x01k", None, at).unwrap();
    tree.drop_window_of(at).unwrap();
    assert!(!tree.finds(b"\x01t\x02op\x01k").unwrap());
    // The window is made again by another key.
    tree.put(b"\x01t\x02op\x01other", None, at).unwrap();
    // The key is written again, by a caller that read its old record before the deletion.
    tree.put(b"\x01t\x02op\x01k", Some(at), at).unwrap();
    assert!(
        tree.finds(b"\x01t\x02op\x01k").unwrap(),
        "lost from its filter"
    );
    tree.reopen().unwrap();
    assert!(
        tree.finds(b"\x01t\x02op\x01k").unwrap(),
        "lost after a reopen"
    );
    assert!(tree.finds(b"\x01t\x02op\x01other").unwrap());
}

/// The seed of the filters' hash in the tests of a filter alone: SipHash's key 00..0f.
const SEED: (u64, u64) = (0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908);

/// A saved filter reads back holding every key it held, across parts; bytes that are not
/// a saved filter (cut short, or with anything changed in the header) are refused rather
/// than read, so the window's filter is built from its keys instead.
#[test]
fn a_saved_filter_reads_back_and_damaged_bytes_are_refused() {
    let filter = Filter::with_capacity(100);
    let hashes: Vec<u64> = (0..5_000u64)
        .map(|i| filter::hash(SEED, format!("key-{i}").as_bytes()))
        .collect();
    for &hash in &hashes {
        filter.insert(hash);
    }
    assert!(filter.parts() > 1, "the filter grew parts");
    let bytes = filter.encode();
    let back = Filter::decode(&bytes).expect("saved bytes read back");
    assert!(back.saved());
    assert_eq!(back.inserted(), filter.inserted());
    for &hash in &hashes {
        assert!(back.may_hold(hash), "a key was lost");
    }
    for len in [0, 1, 2, 10, 25, bytes.len() - 1] {
        assert!(Filter::decode(&bytes[..len]).is_none(), "cut at {len}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(Filter::decode(&longer).is_none(), "a byte too many");
    assert!(Filter::decode(&seal(&longer)).is_none(), "a word cut short");
    for at in [0, 1, 2, 40, bytes.len() / 2, bytes.len() - 1] {
        let mut changed = bytes.clone();
        changed[at] ^= 0x10;
        assert!(Filter::decode(&changed).is_none(), "byte {at} changed");
    }
    for (at, value) in [(0, 1), (0, 3), (1, 0), (1, 13)] {
        let mut changed = unsealed(&bytes);
        changed[at] = value;
        let changed = seal(&changed);
        assert!(Filter::decode(&changed).is_none(), "byte {at} = {value}");
    }
}

/// A row's bytes before its CRC.
fn unsealed(row: &[u8]) -> Vec<u8> {
    row[..row.len() - 4].to_vec()
}

/// `bytes` with their CRC-32 after them, as a saved row ends.
fn seal(bytes: &[u8]) -> Vec<u8> {
    let mut row = bytes.to_vec();
    row.extend_from_slice(&crc32(bytes).to_le_bytes());
    row
}

/// A saved row that is not what `insert` makes, though its CRC matches (written so on
/// purpose, or by a bug), is refused before anything is allocated for it, without an
/// overflow or a panic: the window's filter is then built from its keys. Its keys-inserted
/// count is bounded, since a new window's filter is sized from the largest count.
#[test]
fn hostile_saved_filters_are_refused_before_anything_is_allocated() {
    let filter = Filter::with_capacity(MIN_CAPACITY);
    for i in 0..3_500u64 {
        filter.insert(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    }
    assert_eq!(filter.parts(), 3, "three parts");
    let bytes = unsealed(&filter.encode());
    assert!(Filter::decode(&seal(&bytes)).is_some(), "the row as saved");
    let put = |bytes: &mut Vec<u8>, at: usize, value: u64| {
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
    };
    let [(first, _), (second, _), (last, _)] = parts(&bytes)[..] else {
        panic!("three parts in the row")
    };
    let cases: Vec<(&str, usize, u64)> = vec![
        (
            "the last part's count past its capacity",
            last + 8,
            4 * 1024 + 1,
        ),
        ("the last part's count at u64::MAX", last + 8, u64::MAX),
        ("a huge count (2^40)", last + 8, 1 << 40),
        ("a part before the last not full", second + 8, 2 * 1024 - 1),
        ("a part before the last over full", first + 8, 1024 + 1),
        (
            "the first part under the smallest",
            first,
            MIN_CAPACITY as u64 / 2,
        ),
        ("a part not twice the last", second, 3 * 1024),
        ("a capacity at u64::MAX", last, u64::MAX),
        ("blocks not the capacity's", first + 16, 33),
        ("blocks of 2^40, past the row", first + 16, 1 << 40),
        ("blocks at u64::MAX", first + 16, u64::MAX),
    ];
    for (what, at, value) in cases {
        let mut changed = bytes.clone();
        put(&mut changed, at, value);
        assert!(Filter::decode(&seal(&changed)).is_none(), "{what}");
    }
    // The same with the row's other fields made to agree (the claimed blocks of a huge
    // capacity): the words must be in the row, so nothing is allocated for them.
    let mut huge = bytes[..2].to_vec();
    huge[1] = 1;
    for value in [1u64 << 40, 0, (1u64 << 40) * 16 / 512] {
        huge.extend_from_slice(&value.to_le_bytes());
    }
    assert!(
        Filter::decode(&seal(&huge)).is_none(),
        "a part past the row"
    );
}

/// The filters' hash is SipHash-1-3 of the key's bytes under the store's seed, pinned to
/// known answers: the first two from siphasher's own vectors of the published algorithm
/// (key 00..0f; the empty message and 00..0e), all three checked against a separate
/// implementation of the reference code. A build whose hash gave other answers would read
/// saved filters as missing their keys.
#[test]
fn the_filter_hash_is_siphash_1_3_of_the_bytes_under_the_seed() {
    let key = b"\x06tenant\x06charge\x074f0c-a1";
    assert_eq!(filter::hash(SEED, b""), 0xabac_0158_050f_c4dc);
    let message: Vec<u8> = (0..15).collect();
    assert_eq!(filter::hash(SEED, &message), 0xd320_d86d_2a51_9956);
    assert_eq!(filter::hash(SEED, key), 0x76f2_e262_19a0_c28d);
    assert_eq!(
        filter::unseeded_hash(key),
        0xef38_fade_2e2a_d016,
        "the all-zero seed"
    );
    let other = (SEED.0 ^ 1, SEED.1);
    assert_ne!(
        filter::hash(other, key),
        filter::hash(SEED, key),
        "the seed keys the hash"
    );
}
