//! The stored form of a response: what [`complete`](crate::Reservations::complete) keeps and a
//! duplicate gets back.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

/// Version byte of the layout written by [`encode`].
const FORMAT: u8 = 1;

/// A response as stored: status, the chosen headers, body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredResponse {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

/// Encodes a response as the key's stored result. All integers are little-endian:
///
/// | bytes | field |
/// |---|---|
/// | 1 | format version, 1 |
/// | 2 | status code |
/// | 1 | number of headers, n |
/// | n × (1 + name + 2 + value) | each header: name length, name (lowercase), value length, value |
/// | rest | the body, as sent |
///
/// Only the headers named in `keep` are stored, in that order, every value of each. At most
/// 255 are stored; a header whose value is over 65535 bytes is left out.
pub(crate) fn encode(
    status: StatusCode,
    headers: &HeaderMap,
    keep: &[HeaderName],
    body: &[u8],
) -> Vec<u8> {
    let chosen: Vec<(&HeaderName, &HeaderValue)> = keep
        .iter()
        .flat_map(|name| headers.get_all(name).iter().map(move |value| (name, value)))
        .filter(|(name, value)| name.as_str().len() <= 255 && value.len() <= usize::from(u16::MAX))
        .take(255)
        .collect();
    let mut out = Vec::with_capacity(4 + body.len());
    out.push(FORMAT);
    out.extend_from_slice(&status.as_u16().to_le_bytes());
    out.push(chosen.len() as u8);
    for (name, value) in chosen {
        out.push(name.as_str().len() as u8);
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(&(value.len() as u16).to_le_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out.extend_from_slice(body);
    out
}

/// Decodes [`encode`]'s bytes; `None` when they are not in that layout.
pub(crate) fn decode(bytes: &[u8]) -> Option<StoredResponse> {
    fn take<'a>(rest: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, tail) = rest.split_at_checked(n)?;
        *rest = tail;
        Some(head)
    }
    let mut rest = bytes;
    if take(&mut rest, 1)? != [FORMAT] {
        return None;
    }
    let status = u16::from_le_bytes(take(&mut rest, 2)?.try_into().ok()?);
    let status = StatusCode::from_u16(status).ok()?;
    let count = take(&mut rest, 1)?[0];
    let mut headers = HeaderMap::new();
    for _ in 0..count {
        let name_len = usize::from(take(&mut rest, 1)?[0]);
        let name = HeaderName::from_bytes(take(&mut rest, name_len)?).ok()?;
        let value_len = usize::from(u16::from_le_bytes(take(&mut rest, 2)?.try_into().ok()?));
        let value = HeaderValue::from_bytes(take(&mut rest, value_len)?).ok()?;
        headers.append(name, value);
    }
    Some(StoredResponse {
        status,
        headers,
        body: Bytes::copy_from_slice(rest),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;

    #[test]
    fn round_trips_the_chosen_headers_and_refuses_garbage() {
        let mut headers = HeaderMap::new();
        headers.insert(header::LOCATION, HeaderValue::from_static("/orders/7"));
        headers.append(header::SET_COOKIE, HeaderValue::from_static("a=1"));
        headers.append(header::SET_COOKIE, HeaderValue::from_static("b=2"));
        headers.insert("x-request-id", HeaderValue::from_static("r-1"));
        let keep = [header::LOCATION, header::SET_COOKIE, header::CONTENT_TYPE];
        let bytes = encode(StatusCode::CREATED, &headers, &keep, b"\0body\xff");
        let stored = decode(&bytes).expect("decodes");
        assert_eq!(stored.status, StatusCode::CREATED);
        assert_eq!(stored.headers["location"], "/orders/7");
        let cookies: Vec<_> = stored.headers.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert!(stored.headers.get("x-request-id").is_none(), "not chosen");
        assert_eq!(stored.headers.len(), 3);
        assert_eq!(&stored.body[..], b"\0body\xff");
        for len in 0..bytes.len() - 6 {
            // Cut inside the header block: refused, never a partial response.
            assert!(decode(&bytes[..len]).is_none(), "{len}");
        }
        assert!(decode(b"\x02\xc9\x00\x00").is_none(), "unknown version");
        assert!(decode(b"\x01\x00\x00\x00").is_none(), "status 0");
    }
}
