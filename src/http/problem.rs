//! Refusals as RFC 9457 problem details (`application/problem+json`).

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;

use crate::guard::problem_json;
pub use crate::guard::{Refusal, PROBLEM_JSON};

/// Builds the problem response. `limit` adds a `limit` member (bytes).
pub fn problem(
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
