//! The benchmark-only store without page checksums (`Builder::__without_page_checksums`,
//! hidden feature `__whitebox`), which the load generator's `idemstore-nopages` engine opens
//! to measure the page layer's cost: it answers as a store does, it is only ever a new file,
//! and it is never taken for a real store afterwards.

use idemstore::OpenError;

use crate::common::{acquire, fp, key, replayed, Env};

/// The first bytes of every plain redb file.
const REDB_SIGNATURE: &[u8] = b"redb\x1A\x0A\xA9\x0D\x0A";

#[test]
fn a_store_without_page_checksums_answers_as_a_store_and_is_a_plain_redb_file() {
    let env = Env::new();
    let store = env
        .builder()
        .__without_page_checksums()
        .open(&env.path)
        .expect("create a store without page checksums");
    let keys: Vec<_> = (0..300).map(|i| key("s", "op", &format!("k{i}"))).collect();
    for (i, k) in keys.iter().enumerate() {
        let lease = acquire(&store, k, fp("body"));
        store
            .complete(&lease, format!("result {i}"))
            .expect("complete");
    }
    // A checkpoint puts the records into the B-tree file.
    store.checkpoint().expect("checkpoint");
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(
            replayed(&store, k, fp("body")).result,
            format!("result {i}").into_bytes()
        );
    }
    drop(store);
    let bytes = std::fs::read(&env.path).expect("read the store file");
    assert!(
        bytes.starts_with(REDB_SIGNATURE),
        "the file starts with {:?}, not redb's signature: it has the page layer",
        &bytes[..16.min(bytes.len())]
    );
}

#[test]
fn a_store_without_page_checksums_is_refused_by_a_normal_open() {
    let env = Env::new();
    let store = env
        .builder()
        .__without_page_checksums()
        .open(&env.path)
        .expect("create a store without page checksums");
    acquire(&store, &key("s", "op", "k"), fp("body"));
    drop(store);
    let plain = std::fs::read(&env.path).unwrap();
    match env.builder().open(&env.path) {
        Err(OpenError::NotAStore { path, reason }) => {
            assert_eq!(path, env.path);
            assert!(reason.contains("plain redb file"), "reason: {reason}");
        }
        Err(other) => panic!("expected NotAStore, got {other}"),
        Ok(_) => panic!("a store without page checksums opened as a real store"),
    }
    assert_eq!(
        std::fs::read(&env.path).unwrap(),
        plain,
        "the refused file was changed"
    );
}

#[test]
fn page_file_lengths_round_trip() {
    use idemstore::whitebox::pages::{logical_len, physical_len, BLOCK, GROUP};
    for len in [
        0,
        1,
        4096,
        4097,
        GROUP * BLOCK,
        GROUP * BLOCK + 5,
        3 * GROUP * BLOCK + 8192,
    ] {
        assert_eq!(logical_len(physical_len(len)), len, "len {len}");
    }
}

#[test]
fn page_blocks_do_not_overlap_sums() {
    use idemstore::whitebox::pages::{data_offset, BLOCK, GROUP, GROUP_BYTES};
    for index in [0, 1, GROUP - 1, GROUP, GROUP + 1, 5 * GROUP + 7] {
        let at = data_offset(index);
        assert_eq!((at - BLOCK) % GROUP_BYTES % BLOCK, 0);
        assert_ne!(
            (at - BLOCK) % GROUP_BYTES,
            0,
            "block {index} on a sums block"
        );
    }
}

#[test]
fn only_a_new_store_is_made_without_page_checksums() {
    let env = Env::new();
    let store = env.open();
    let k = key("s", "op", "kept");
    let lease = acquire(&store, &k, fp("body"));
    store.complete(&lease, "kept").expect("complete");
    drop(store);
    let before = std::fs::read(&env.path).expect("read the store file");
    let refused = env.builder().__without_page_checksums().open(&env.path);
    match refused {
        Err(e @ OpenError::Storage(idemstore::StorageError::Io { .. })) => {
            let message = e.to_string();
            assert!(
                message.contains("always a new file") && message.contains("store.idem"),
                "message: {message}"
            );
        }
        Err(other) => panic!("expected an I/O error saying the file exists, got {other}"),
        Ok(_) => panic!("an existing store was opened without page checksums"),
    }
    assert_eq!(
        std::fs::read(&env.path).expect("read the store file"),
        before,
        "the refused open changed the store file"
    );
    let store = env.open();
    assert_eq!(replayed(&store, &k, fp("body")).result, b"kept");
    drop(store);
    // A path that is already something else is refused too.
    let other = env.dir.path().join("dir.idem");
    std::fs::create_dir(&other).expect("create a directory");
    assert!(env
        .builder()
        .__without_page_checksums()
        .open(&other)
        .is_err());
}

#[test]
fn the_page_layer_counts_its_checksums_for_the_load_generator() {
    let env = Env::new();
    let store = env.open();
    for i in 0..200 {
        let lease = acquire(&store, &key("s", "op", &format!("k{i}")), fp("body"));
        store.complete(&lease, "done").expect("complete");
    }
    // Other tests run alongside and only add to the process's counters: the checkpoint's own
    // work is a lower bound of the difference.
    let (summed, sums_written) = idemstore::whitebox::page_work();
    store.checkpoint().expect("checkpoint");
    let (summed_after, sums_written_after) = idemstore::whitebox::page_work();
    assert!(
        summed_after > summed,
        "a checkpoint wrote B-tree pages but no checksum was counted ({summed} -> {summed_after})"
    );
    assert!(
        sums_written_after > sums_written,
        "a checkpoint synced but no sums block write was counted"
    );
    // The function the load generator times is the layer's: it mixes the block number in.
    let block = [7u8; 4096];
    assert_ne!(
        idemstore::whitebox::page_sum(1, &block),
        idemstore::whitebox::page_sum(2, &block)
    );
}
