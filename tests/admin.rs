//! The admin socket's parts below a connection: who it admits, and its messages, which
//! round-trip and refuse hostile bytes without panicking.

use std::time::Duration;

use idemstore::whitebox::admin::{admits, Answer, Failure, Request, VERSION};
use idemstore::{
    Fingerprint, Key, ManualClock, Record, RecordClass, Reservation, Resolution, ScanFilter,
    StateCounts, Store,
};

#[test]
fn the_owner_and_root_are_admitted_and_no_one_else() {
    assert!(admits(1000, 1000));
    assert!(admits(0, 1000));
    assert!(admits(0, 0));
    assert!(!admits(1001, 1000));
    assert!(!admits(1000, 0));
}

/// A completed record, as a store writes it.
fn record() -> Record {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::builder()
        .clock(ManualClock::new())
        .sweep_interval(None)
        .open(dir.path().join("s.idem"))
        .unwrap();
    let key = Key::new("s", "op", "id").unwrap();
    let Reservation::Acquired(lease) = store.reserve(&key, Fingerprint::of(b"x")).unwrap() else {
        panic!("a new key");
    };
    store.complete(&lease, b"ok".to_vec()).unwrap();
    store.get(&key).unwrap().unwrap()
}

#[test]
fn requests_and_answers_round_trip() {
    let key = Key::new("s", "op", "id").unwrap();
    let requests = [
        Request::FileInfo,
        Request::Counts,
        Request::Get(key.clone()),
        Request::Scan(
            ScanFilter::of(RecordClass::Stale).older_than(Duration::from_secs(5)),
            10,
        ),
        Request::Expire {
            key: key.clone(),
            force: true,
        },
        Request::Resolve {
            key: key.clone(),
            resolution: Resolution::Complete(b"r".to_vec()),
            retention: Some(Duration::from_secs(3)),
        },
        Request::Sweep(5),
        Request::Checkpoint,
    ];
    for request in requests {
        assert_eq!(Request::decode(&request.encode()), Ok(request.clone()));
    }
    let mut counts = StateCounts::default();
    counts.completed = 3;
    counts.oldest_pending = Some((key.clone(), record()));
    let cases = [
        (Request::Counts, Answer::Counts(counts)),
        (Request::Get(key.clone()), Answer::Get(Some(record()))),
        (
            Request::Scan(ScanFilter::any(), 5),
            Answer::Scan(vec![(key.clone(), record())]),
        ),
        (
            Request::Expire {
                key: key.clone(),
                force: false,
            },
            Answer::Expire(Some(RecordClass::Expired)),
        ),
        (Request::Sweep(3), Answer::Sweep(2)),
    ];
    for (request, answer) in cases {
        let bytes = Answer::encode(Ok(answer.clone()));
        assert_eq!(Answer::decode(&request, &bytes), Ok(Ok(answer)));
    }
    let failure = Failure {
        message: "no".into(),
        lease_until: Some(5),
    };
    let bytes = Answer::encode(Err(failure.clone()));
    assert_eq!(Answer::decode(&Request::Counts, &bytes), Ok(Err(failure)));
}

#[test]
fn hostile_bytes_are_refused_without_panicking() {
    let request = Request::Scan(ScanFilter::any(), 1).encode();
    for cut in 0..request.len() {
        assert!(Request::decode(&request[..cut]).is_err());
    }
    let mut longer = request.clone();
    longer.push(0);
    assert!(Request::decode(&longer).is_err());
    assert!(Request::decode(&[VERSION + 1, 1])
        .unwrap_err()
        .contains("version"));
    let answer = Answer::encode(Ok(Answer::Scan(vec![(
        Key::new("s", "o", "i").unwrap(),
        record(),
    )])));
    for cut in 0..answer.len() {
        assert!(Answer::decode(&Request::Scan(ScanFilter::any(), 1), &answer[..cut]).is_err());
    }
    // A huge count with no records behind it allocates nothing and fails.
    let mut lying = vec![0];
    lying.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(Answer::decode(&Request::Scan(ScanFilter::any(), 1), &lying).is_err());
}
