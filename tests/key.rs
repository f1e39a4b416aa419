//! Keys: their parts, limits and length-prefixed encoding, and the hash they carry for the
//! maps in memory.

use std::collections::HashSet;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};

use idemstore::whitebox::{key_decode, key_encoded};
use idemstore::Key;

#[test]
fn parts_round_trip() {
    let key = Key::new("s", "op", "id-1").unwrap();
    assert_eq!(key.scope(), b"s");
    assert_eq!(key.operation(), b"op");
    assert_eq!(key.id(), b"id-1");
    assert_eq!(key_decode(&key_encoded(&key)), Some(key.clone()));
    assert_eq!(key.to_string(), "s/op/id-1");
}

#[test]
fn length_prefix_keeps_parts_apart() {
    let a = Key::new("a:b", "c", "x").unwrap();
    let b = Key::new("a", "b:c", "x").unwrap();
    assert_ne!(a, b);
    assert_ne!(key_encoded(&a), key_encoded(&b));
}

#[test]
fn limits_are_enforced_and_named() {
    let long = vec![b'x'; Key::MAX_PART_LEN + 1];
    let err = Key::new("s", "op", &long).unwrap_err();
    assert!(err.to_string().contains("id"), "{err}");
    assert!(err.to_string().contains("256"), "{err}");
    assert!(Key::new("", "op", "id").is_err());
    assert!(Key::new("s", "", "id").is_err());
    assert!(Key::new("s", "op", "").is_err());
    let max = vec![b'y'; Key::MAX_PART_LEN];
    assert!(Key::new(&max, &max, &max).is_ok());
}

#[test]
fn a_decoded_key_equals_and_hashes_as_the_key_it_was_encoded_from() {
    let key = Key::new("tenant", "op", "id-1").unwrap();
    let decoded = key_decode(&key_encoded(&key)).unwrap();
    assert_eq!(decoded, key);
    let set: HashSet<Key> = [key.clone()].into_iter().collect();
    assert!(set.contains(&decoded), "a decoded key missed its own entry");
    let other = Key::new("tenant", "op", "id-2").unwrap();
    assert_ne!(other, key);
    assert!(!set.contains(&other));
    assert!(key < other, "keys sort by their bytes");
}

/// The hash a key carries for the maps in memory is seeded at random per process: two runs
/// of this test binary hash the same key differently (a fixed seed would let a client work
/// out keys that collide in the maps, the same in every process). The key is hashed through
/// its public `Hash` into an unseeded hasher, so what differs is what the key feeds it.
#[test]
fn the_in_memory_hash_is_seeded_per_process() {
    const PRINT: &str = "IDEMSTORE_PRINT_KEY_HASH";
    const NAME: &str = "key::the_in_memory_hash_is_seeded_per_process";
    let key = Key::new("tenant", "op", "id-1").unwrap();
    let hash = |key: &Key| BuildHasherDefault::<DefaultHasher>::default().hash_one(key);
    if std::env::var_os(PRINT).is_some() {
        println!("hash={:016x}", hash(&key));
        return;
    }
    let run = || {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env(PRINT, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let hash = text.split("hash=").nth(1).and_then(|rest| rest.get(..16));
        hash.map(str::to_owned)
            .unwrap_or_else(|| panic!("the child printed no hash: {text}"))
    };
    let (first, second) = (run(), run());
    let here = format!("{:016x}", hash(&key));
    assert_ne!(first, second, "two processes hashed a key alike");
    assert!(
        first != here && second != here,
        "a child hashed a key as this process"
    );
}

#[test]
fn decode_rejects_bad_bytes() {
    assert_eq!(key_decode(b""), None);
    assert_eq!(key_decode(&[1, b'a', 1, b'b']), None);
    assert_eq!(key_decode(&[1, b'a', 1, b'b', 0]), None);
    assert_eq!(key_decode(&[1, b'a', 1, b'b', 1, b'c', 9]), None);
    assert_eq!(key_decode(&[200, b'a']), None);
}
