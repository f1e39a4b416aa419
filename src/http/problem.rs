//! Refusals as RFC 9457 problem details (`application/problem+json`).

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;

use crate::guard::problem_json;
pub use crate::guard::{Refusal, PROBLEM_JSON};

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
