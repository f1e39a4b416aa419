//! Refusals as RFC 9457 problem details (`application/problem+json`), in the numbers and text
//! every HTTP adapter sends: the status of each refusal, the problem's JSON, the
//! `Retry-After` seconds. Each adapter puts them in its framework's response type.

use crate::guard::{Refusal, Refused};

/// The media type of every refusal body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The HTTP status of each refusal, `body_too_large` for [`Refusal::BodyTooLarge`].
pub(crate) fn http_status(refusal: Refusal, body_too_large: u16) -> u16 {
    match refusal {
        Refusal::KeyMissing | Refusal::KeyInvalid | Refusal::BodyUnreadable => 400,
        Refusal::NoScope => 401,
        Refusal::BodyTooLarge => body_too_large,
        Refusal::InProgress | Refusal::UnderReview => 409,
        Refusal::KeyReused => 422,
        Refusal::StoreUnavailable => 503,
        Refusal::StoredResponseUnreadable | Refusal::ResponseUnreadable => 500,
        Refusal::ResponseNotStored => 410,
    }
}

/// `Retry-After` in whole seconds (at least 1), when the guard gave a delay.
pub(crate) fn retry_after_secs(refused: &Refused) -> Option<u64> {
    let delay = refused.retry_after?;
    Some(delay.as_secs_f64().ceil().max(1.0) as u64)
}

/// The problem's JSON text. `limit` adds a `limit` member (bytes).
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
