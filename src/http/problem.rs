//! Refusals as RFC 9457 problem details (`application/problem+json`).

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;

/// The media type of every refusal body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Why the layer answered a request itself instead of running (or replaying) the handler.
///
/// Each refusal is an RFC 9457 problem: a JSON object with `type`, `title`, `status` and
/// `detail`, and for the size refusals a `limit` member (bytes). `type` is
/// [`problem_base`](crate::http::IdempotencyLayer::problem_base) followed by the refusal's
/// [`slug`](Refusal::slug).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// No `Idempotency-Key` on a guarded method (400, unless configured to pass through).
    KeyMissing,
    /// The key is empty, sent twice, or longer than [`MAX_KEY_PART_LEN`](crate::MAX_KEY_PART_LEN)
    /// bytes (400).
    KeyInvalid,
    /// The scope extractor found no scope (user, tenant) for the request (401).
    NoScope,
    /// The request body is over the fingerprinting limit (413 by default).
    BodyTooLarge,
    /// The request body could not be read (400).
    BodyUnreadable,
    /// A request with this key is still running (409, with `Retry-After`).
    InProgress,
    /// The key was used before with another request (422).
    KeyReused,
    /// The key is held for a person to review (409).
    UnderReview,
    /// The idempotency store failed (503, with `Retry-After`).
    StoreUnavailable,
    /// The stored response for the key does not decode (500).
    StoredResponseUnreadable,
    /// The handler's response body failed while it was read for storing (500); the key is
    /// released.
    ResponseUnreadable,
}

impl Refusal {
    /// The last part of the problem `type`, e.g. `key-missing`.
    pub fn slug(self) -> &'static str {
        match self {
            Refusal::KeyMissing => "key-missing",
            Refusal::KeyInvalid => "key-invalid",
            Refusal::NoScope => "no-scope",
            Refusal::BodyTooLarge => "body-too-large",
            Refusal::BodyUnreadable => "body-unreadable",
            Refusal::InProgress => "in-progress",
            Refusal::KeyReused => "key-reused",
            Refusal::UnderReview => "under-review",
            Refusal::StoreUnavailable => "store-unavailable",
            Refusal::StoredResponseUnreadable => "stored-response-unreadable",
            Refusal::ResponseUnreadable => "response-unreadable",
        }
    }

    /// The problem's `title`: the same for every occurrence of the refusal.
    pub fn title(self) -> &'static str {
        match self {
            Refusal::KeyMissing => "Idempotency-Key is missing",
            Refusal::KeyInvalid => "Idempotency-Key is invalid",
            Refusal::NoScope => "No scope for the Idempotency-Key",
            Refusal::BodyTooLarge => "Request body too large",
            Refusal::BodyUnreadable => "Request body unreadable",
            Refusal::InProgress => "A request is outstanding for this Idempotency-Key",
            Refusal::KeyReused => "Idempotency-Key is already used",
            Refusal::UnderReview => "The request for this Idempotency-Key is under review",
            Refusal::StoreUnavailable => "Idempotency store unavailable",
            Refusal::StoredResponseUnreadable => "Stored response unreadable",
            Refusal::ResponseUnreadable => "Response unreadable",
        }
    }
}

/// Builds the problem response. `limit` adds a `limit` member (bytes).
pub(crate) fn problem(
    base: &str,
    refusal: Refusal,
    status: StatusCode,
    detail: &str,
    limit: Option<usize>,
) -> Response<Full<Bytes>> {
    let mut json = format!(
        r#"{{"type":"{}{}","title":"{}","status":{},"detail":"{}""#,
        escape(base),
        refusal.slug(),
        refusal.title(),
        status.as_u16(),
        escape(detail)
    );
    if let Some(limit) = limit {
        json += &format!(r#","limit":{limit}"#);
    }
    json.push('}');
    let mut response = Response::new(Full::new(Bytes::from(json)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}

/// `text` as the inside of a JSON string.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_are_escaped_and_limits_reported() {
        let response = problem(
            "https://example.com/problems/",
            Refusal::BodyTooLarge,
            StatusCode::PAYLOAD_TOO_LARGE,
            "a \"quoted\"\\ line\nand\u{1}",
            Some(1024),
        );
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(response.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        let body = response.into_body();
        let bytes = futures_free_collect(body);
        assert_eq!(
            bytes,
            r#"{"type":"https://example.com/problems/body-too-large","title":"Request body too large","status":413,"detail":"a \"quoted\"\\ line\nand\u0001","limit":1024}"#
        );
    }

    /// A `Full` body's one frame, read without an executor.
    fn futures_free_collect(body: Full<Bytes>) -> String {
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
}
