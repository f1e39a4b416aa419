//! Refusals as RFC 9457 problem details (`application/problem+json`).

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;

pub use crate::guard::Refusal;

/// The media type of every refusal body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Builds the problem response. `limit` adds a `limit` member (bytes).
pub(crate) fn problem(
    base: &str,
    refusal: Refusal,
    status: StatusCode,
    detail: &str,
    limit: Option<usize>,
) -> Response<Full<Bytes>> {
    let json = problem_json(base, refusal, status.as_u16(), detail, limit);
    let mut response = Response::new(Full::new(Bytes::from(json)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}

/// The problem's JSON text; shared by every HTTP adapter (the actix-web middleware answers the
/// same).
pub(crate) fn problem_json(
    base: &str,
    refusal: Refusal,
    status: u16,
    detail: &str,
    limit: Option<usize>,
) -> String {
    let mut json = format!(
        r#"{{"type":"{}{}","title":"{}","status":{},"detail":"{}""#,
        escape(base),
        refusal.slug(),
        refusal.title(),
        status,
        escape(detail)
    );
    if let Some(limit) = limit {
        json += &format!(r#","limit":{limit}"#);
    }
    json.push('}');
    json
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
