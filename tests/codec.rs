//! The bytes on disk, one decoder at a time: the record codec, the log's frames and the log's
//! identity block. Every decoder refuses damaged or hostile bytes with an error, never a
//! panic or a wrong value.

use std::time::Duration;

use idemstore::whitebox::{
    decode_payload, decode_record, encode, encode_record, identity_block, parse_header,
    parse_identity, Entry, Frame, Header, Identity, ALIGN, HEADER_LEN, RECORD_HEADER_LEN,
};
use idemstore::{Fingerprint, Key, ManualClock, Record, Reservation, Store};

/// One record in each state (pending with and without a recovery point, completed, parked
/// for review), as a store writes them.
fn samples() -> Vec<Record> {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::builder()
        .clock(ManualClock::new())
        .lease(Duration::from_secs(10))
        .sweep_interval(None)
        .open(dir.path().join("s.idem"))
        .unwrap();
    let key = |id: &str| Key::new("u", "op", id).unwrap();
    let acquire = |id: &str| match store.reserve(&key(id), Fingerprint::of(b"req")).unwrap() {
        Reservation::Acquired(lease) => lease,
        other => panic!("{other:?}"),
    };
    acquire("pending");
    let stepped = acquire("stepped");
    store
        .record_step(&stepped, 3, b"charge ch_1 created")
        .unwrap();
    let done = acquire("done");
    store.complete(&done, b"200 OK".to_vec()).unwrap();
    let review = acquire("review");
    store
        .mark_needs_review(&review, "gateway timeout, charge unknown")
        .unwrap();
    ["pending", "stepped", "done", "review"]
        .map(|id| store.get(&key(id)).unwrap().unwrap())
        .to_vec()
}

#[test]
fn encode_decode_round_trip() {
    for record in samples() {
        assert_eq!(decode_record(&encode_record(&record)), Ok(record));
    }
}

#[test]
fn every_flipped_bit_of_a_record_is_detected() {
    for record in samples() {
        let bytes = encode_record(&record);
        for bit in 0..bytes.len() * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_record(&damaged).is_err(), "bit {bit} undetected");
        }
    }
}

#[test]
fn truncated_and_garbage_record_bytes_are_errors() {
    let bytes = encode_record(&samples()[2]);
    for len in 0..bytes.len() {
        assert!(decode_record(&bytes[..len]).is_err());
    }
    assert!(decode_record(&[0xff; 200]).is_err());
}

#[test]
fn wrong_record_length_field_with_valid_crc_is_an_error() {
    const CRC_LEN: usize = 4;
    let mut bytes = encode_record(&samples()[2]);
    bytes.truncate(bytes.len() - CRC_LEN);
    bytes[RECORD_HEADER_LEN - 4] = 99; // payload length field
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    let err = decode_record(&bytes).unwrap_err();
    assert!(err.contains("payload length"), "{err}");
}

fn entries() -> Vec<Entry> {
    vec![
        Entry {
            key: b"\x01a\x01b\x01c".to_vec(),
            record: Some(b"record bytes".to_vec()),
        },
        Entry {
            key: b"\x01a\x01b\x01d".to_vec(),
            record: None,
        },
    ]
}

fn refs(entries: &[Entry]) -> impl ExactSizeIterator<Item = (&[u8], Option<&[u8]>)> {
    entries
        .iter()
        .map(|e| (e.key.as_slice(), e.record.as_deref()))
}

#[test]
fn frames_round_trip_aligned() {
    let mut out = Vec::new();
    encode(usize::MAX, 5, 9, 8, 77, refs(&entries()), &mut out);
    assert_eq!(out.len() % ALIGN, 0);
    let header = parse_header(5, &out).unwrap();
    assert_eq!(parse_header(6, &out), None, "another salt never parses");
    assert_eq!((header.seq, header.durable), (9, 8));
    assert_eq!(header.frame_len(), out.len());
    let frame = decode_payload(
        &header,
        &out[HEADER_LEN..HEADER_LEN + header.payload_len],
        0,
    )
    .unwrap();
    assert_eq!(
        frame,
        Frame {
            seq: 9,
            durable: 8,
            next_token: 77,
            entries: entries()
        }
    );
}

#[test]
fn every_flipped_bit_of_a_frame_is_caught() {
    let mut out = Vec::new();
    encode(usize::MAX, 0, 3, 2, 5, refs(&entries()), &mut out);
    let used = HEADER_LEN + parse_header(0, &out).unwrap().payload_len;
    for bit in 0..used * 8 {
        let mut damaged = out.clone();
        damaged[bit / 8] ^= 1 << (bit % 8);
        let ok = parse_header(0, &damaged).and_then(|h| {
            damaged
                .get(HEADER_LEN..HEADER_LEN + h.payload_len)
                .and_then(|p| decode_payload(&h, p, 0).ok())
        });
        assert!(ok.is_none(), "bit {bit} undetected");
    }
}

#[test]
fn hostile_frame_payload_with_valid_crc_is_an_error() {
    let payload = [0u8, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 1];
    let header = Header {
        payload_len: payload.len(),
        seq: 1,
        durable: 0,
        payload_crc: crc32fast::hash(&payload),
    };
    assert!(decode_payload(&header, &payload, 0).is_err());
}

#[test]
fn log_identities_are_told_apart() {
    assert_eq!(parse_identity(&identity_block(7), 7), Identity::Ours);
    assert_eq!(parse_identity(&identity_block(7), 8), Identity::Other(7));
    assert_eq!(parse_identity(&[0; 32], 7), Identity::Fresh);
    let mut damaged = identity_block(7);
    damaged[9] ^= 1;
    assert_eq!(parse_identity(&damaged, 7), Identity::Damaged);
    let mut v3 = identity_block(7);
    v3[7] = 3;
    let crc = crc32fast::hash(&v3[..28]);
    v3[28..].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(
        parse_identity(&v3, 7),
        Identity::Damaged,
        "a development layout is not read"
    );
}
