//! The framework-neutral core of the `Idempotency-Key` layer, below the HTTP stack: reading
//! the client's key, the stored key it becomes, the stored response form and problem+json
//! refusals.

use bytes::Bytes;
use http::{header, StatusCode};
use http_body_util::Full;
use idemstore::guard::{client_key, request_key, Refusal, StoredResponse, PROBLEM_JSON};
use idemstore::whitebox::guard::{
    encode, encoded_len, not_stored, not_stored_status, problem, sf_string, status, trim_spaces,
    unescaped_string,
};

fn detail(values: &[&[u8]]) -> String {
    client_key(values.iter().copied()).unwrap_err().detail
}

#[test]
fn keys_are_read_quoted_or_bare_and_refused_with_the_limit() {
    assert_eq!(client_key([]), Ok(None));
    assert_eq!(client_key([&b"\"k-1\""[..]]), Ok(Some(b"k-1".to_vec())));
    assert_eq!(client_key([&b"k-1"[..]]), Ok(Some(b"k-1".to_vec())));
    assert_eq!(client_key([&b"  k-1 "[..]]), Ok(Some(b"k-1".to_vec())));
    assert!(detail(&[b"\"\""]).contains("empty"));
    let error = detail(&[&[b'k'; 256]]);
    assert!(
        error.contains("256 bytes") && error.contains("255"),
        "{error}"
    );
    assert!(detail(&[b"a", b"b"]).contains("one"));
    assert_eq!(trim_spaces(b"   "), b"");
    assert_eq!(trim_spaces(b" \ta "), b"\ta");
}

#[test]
fn the_parser_is_skipped_only_for_what_it_would_read_the_same() {
    for value in [&b"\"k-1\""[..], b"\"a b,c;d=e\"", b"\"\"", b"\"~!#\""] {
        let fast = unescaped_string(value).expect("a string without escapes");
        assert_eq!(Ok(fast.to_vec()), sf_string(value), "{value:?}");
    }
    for value in [
        &b"\"a\\\"b\""[..],
        b"\"x\", \"y\"",
        b"\"a\";p=1",
        b"\"",
        b"\"tab\there\"",
        b"\"\xc3\xa9\"",
        b"k-1",
    ] {
        assert_eq!(unescaped_string(value), None, "{value:?}");
    }
}

/// A scope or an operation longer than a key's part is stored as `#` and its digest:
/// distinct long parts stay distinct, and the key is valid.
#[test]
fn long_parts_are_replaced_by_their_digest() {
    let scope = Some(b"u".to_vec());
    let short = b"POST /orders";
    let key = |operation: &[u8]| request_key(scope.clone(), operation, b"id").unwrap();
    assert_eq!(key(short).operation(), short);
    let a = key(&[b'a'; 300]);
    let b = key(&[vec![b'a'; 299], vec![b'b']].concat());
    assert_eq!((a.operation().len(), a.operation()[0]), (65, b'#'));
    assert_ne!(
        a.operation(),
        b.operation(),
        "distinct long parts stay distinct"
    );
    let long_scope = request_key(Some(vec![b's'; 300]), short, b"id").unwrap();
    assert_eq!(long_scope.scope().len(), 65);
}

#[test]
fn no_scope_is_refused() {
    let refused = request_key(Some(Vec::new()), b"POST /x", b"k").unwrap_err();
    assert_eq!(refused.refusal, Refusal::NoScope);
    assert!(request_key(None, b"POST /x", b"k").is_err());
    assert!(request_key(Some(b"u".to_vec()), b"POST /x", b"k").is_ok());
}

#[test]
fn stored_responses_round_trip_and_garbage_is_refused() {
    let headers = [
        ("location", &b"/orders/7"[..]),
        ("set-cookie", b"a=1"),
        ("set-cookie", b"b=2"),
    ];
    let body = b"\0body\xff";
    let bytes = encode(201, headers, body);
    let stored = StoredResponse::decode(&bytes).expect("decodes");
    assert_eq!(stored.status, 201);
    let owned: Vec<(String, Vec<u8>)> = headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_vec()))
        .collect();
    assert_eq!(stored.headers, owned);
    assert_eq!(&stored.body[..], b"\0body\xff");
    assert_eq!(stored.encode(), bytes);
    assert_eq!(encoded_len(headers, body.len() as u64), bytes.len() as u64);
    assert_eq!(status(&bytes), Some(201));
    for len in 0..bytes.len() - 6 {
        // Cut inside the header block: refused, never a partial response.
        assert!(StoredResponse::decode(&bytes[..len]).is_none(), "{len}");
    }
    assert!(
        StoredResponse::decode(b"\x02\xc9\x00\x00").is_none(),
        "unknown version"
    );
    assert!(
        StoredResponse::decode(b"\x01\x00\x00\x00").is_none(),
        "status 0"
    );
    let marker = not_stored(200);
    assert_eq!(not_stored_status(&marker), Some(200));
    assert!(
        StoredResponse::decode(&marker).is_none(),
        "a marker is no response"
    );
    assert_eq!(not_stored_status(&bytes), None);
    assert_eq!(status(&marker), None, "a marker has no stored status");
}

#[test]
fn problem_details_are_escaped_and_limits_reported() {
    let response = problem(
        "https://example.com/problems/",
        Refusal::BodyTooLarge,
        StatusCode::PAYLOAD_TOO_LARGE,
        "a \"quoted\"\\ line\nand\u{1}",
        Some(1024),
    );
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(response.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
    let bytes = one_frame(response.into_body());
    assert_eq!(
        bytes,
        r#"{"type":"https://example.com/problems/body-too-large","title":"Request body too large","status":413,"detail":"a \"quoted\"\\ line\nand\u0001","limit":1024}"#
    );
}

/// A `Full` body's one frame, read without an executor.
fn one_frame(body: Full<Bytes>) -> String {
    use http_body::Body;
    use std::task::{Context, Poll, Waker};
    let mut body = std::pin::pin!(body);
    let mut cx = Context::from_waker(Waker::noop());
    match body.as_mut().poll_frame(&mut cx) {
        Poll::Ready(Some(Ok(frame))) => {
            String::from_utf8(frame.into_data().expect("data").to_vec()).expect("UTF-8")
        }
        other => panic!("not one ready frame: {other:?}"),
    }
}
