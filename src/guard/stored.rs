//! [`StoredResponse`]: the stored form of a response, what
//! [`complete`](crate::Reservations::complete) keeps and a duplicate gets back. Framework
//! neutral (status, header names and values as bytes), so that every adapter over the same
//! store reads what another wrote.

/// Version byte of the layout written by [`StoredResponse::encode`].
const FORMAT: u8 = 1;
/// First byte of the marker stored for a response that was not stored (streamed, or over
/// [`Guard::max_stored_response`](crate::guard::Guard::max_stored_response)): `2`, then the
/// response's status (2 bytes, little-endian). Never a valid [`StoredResponse`].
const NOT_STORED: u8 = 2;

/// The marker of a response with this status that was sent but not stored.
pub fn not_stored(status: u16) -> Vec<u8> {
    let mut out = vec![NOT_STORED];
    out.extend_from_slice(&status.to_le_bytes());
    out
}

/// The status of a [`not_stored`] marker; `None` for anything else.
pub fn not_stored_status(bytes: &[u8]) -> Option<u16> {
    match bytes {
        [NOT_STORED, low, high] => Some(u16::from_le_bytes([*low, *high])),
        _ => None,
    }
}

/// A response as stored: its status, the headers chosen to be replayed, and its body.
///
/// ```
/// use idemstore::guard::StoredResponse;
///
/// let response = StoredResponse {
///     status: 201,
///     headers: vec![("location".into(), b"/orders/7".to_vec())],
///     body: b"created".to_vec(),
/// };
/// let bytes = response.encode();
/// assert_eq!(StoredResponse::decode(&bytes), Some(response));
/// assert_eq!(StoredResponse::decode(b"not a response"), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The status code (HTTP, or the code an adapter maps its own status to).
    pub status: u16,
    /// Header names (lowercase) and values, in order; a name may repeat.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body, as sent.
    pub body: Vec<u8>,
}

impl StoredResponse {
    /// Encodes the response as a key's stored result. All integers are little-endian:
    ///
    /// | bytes | field |
    /// |---|---|
    /// | 1 | format version, 1 |
    /// | 2 | status code |
    /// | 1 | number of headers, n |
    /// | n × (1 + name + 2 + value) | each header: name length, name (lowercase), value length, value |
    /// | rest | the body, as sent |
    ///
    /// At most 255 headers are stored; a header whose name is over 255 bytes or whose value is
    /// over 65535 bytes is left out.
    pub fn encode(&self) -> Vec<u8> {
        encode(
            self.status,
            self.headers.iter().map(|(n, v)| (n.as_str(), &v[..])),
            &self.body,
        )
    }

    /// Decodes [`encode`](Self::encode)'s bytes; `None` when they are not in that layout (a
    /// cut or damaged result is refused whole, never returned in part).
    pub fn decode(bytes: &[u8]) -> Option<StoredResponse> {
        let mut headers = Vec::new();
        let (status, body) = walk(bytes, |name, value| {
            headers.push((name.to_owned(), value.to_vec()));
        })?;
        Some(StoredResponse {
            status,
            headers,
            body: bytes[body..].to_vec(),
        })
    }

    /// The status of a response that was sent but not stored (streamed, or over
    /// [`Guard::max_stored_response`](crate::guard::Guard::max_stored_response)): a stored
    /// result that is such a marker; `None` for anything else, a [`StoredResponse`] included.
    ///
    /// ```
    /// use idemstore::guard::StoredResponse;
    ///
    /// assert_eq!(StoredResponse::not_stored_status(b"\x02\xc8\x00"), Some(200));
    /// assert_eq!(StoredResponse::not_stored_status(b"200 OK"), None);
    /// ```
    pub fn not_stored_status(bytes: &[u8]) -> Option<u16> {
        not_stored_status(bytes)
    }
}

/// Reads [`StoredResponse::encode`]'s bytes without copying them: hands each header to
/// `header` (name, value), and returns the status and where the body starts. `None` when the
/// bytes are not in that layout; then `header` may have been called for the headers before
/// the damage, which the caller throws away.
pub(crate) fn walk<'a>(
    bytes: &'a [u8],
    mut header: impl FnMut(&'a str, &'a [u8]),
) -> Option<(u16, usize)> {
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
    if !(100..=999).contains(&status) {
        return None;
    }
    let count = take(&mut rest, 1)?[0];
    for _ in 0..count {
        let name_len = usize::from(take(&mut rest, 1)?[0]);
        let name = std::str::from_utf8(take(&mut rest, name_len)?).ok()?;
        if name.is_empty() {
            return None;
        }
        let value_len = usize::from(u16::from_le_bytes(take(&mut rest, 2)?.try_into().ok()?));
        header(name, take(&mut rest, value_len)?);
    }
    Some((status, bytes.len() - rest.len()))
}

/// The headers [`encode`] keeps: a name of at most 255 bytes and a value of at most 65535, at
/// most 255 of them.
fn kept<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> impl Iterator<Item = (&'a str, &'a [u8])> {
    headers
        .into_iter()
        .filter(|(name, value)| name.len() <= 255 && value.len() <= usize::from(u16::MAX))
        .take(255)
}

/// The length of [`encode`]'s bytes for these headers and a body of `body_len` bytes, known
/// before the body is read: what a guard compares with
/// [`max_stored_response`](crate::guard::Guard::max_stored_response).
pub fn encoded_len<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    body_len: u64,
) -> u64 {
    let headers: u64 = kept(headers)
        .map(|(name, value)| (1 + name.len() + 2 + value.len()) as u64)
        .sum();
    4 + headers + body_len
}

/// The status of [`encode`]'s bytes, read from their first bytes without decoding the rest;
/// `None` for anything else (a marker, another adapter's bytes).
pub fn status(bytes: &[u8]) -> Option<u16> {
    match bytes {
        [FORMAT, low, high, ..] => {
            Some(u16::from_le_bytes([*low, *high])).filter(|s| (100..=999).contains(s))
        }
        _ => None,
    }
}

/// [`StoredResponse::encode`] from borrowed parts, so an adapter need not copy the body first.
pub fn encode<'a>(
    status: u16,
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    body: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 64 + body.len());
    out.push(FORMAT);
    out.extend_from_slice(&status.to_le_bytes());
    out.push(0); // The count, written once the headers are.
    let mut count = 0u8;
    for (name, value) in kept(headers) {
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(value.len() as u16).to_le_bytes());
        out.extend_from_slice(value);
        count += 1;
    }
    out[3] = count;
    out.extend_from_slice(body);
    out
}
