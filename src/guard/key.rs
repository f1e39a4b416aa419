//! Reading the client's key and building the stored [`Key`] from it, its scope and operation.

use std::borrow::Cow;

use crate::guard::{Refusal, Refused};
use crate::{Fingerprint, Key};

/// The client's key from the values it sent (the `Idempotency-Key` header fields, say), read
/// as draft-ietf-httpapi-idempotency-key-header-07 says: the value is an RFC 8941 sf-string.
/// Every adapter reads its key here (the HTTP layer, the actix-web middleware, the gRPC
/// metadata entry), so they accept and refuse the same values.
///
/// | value sent | key |
/// |---|---|
/// | none | `Ok(None)`: no key |
/// | one sf-string, `"k-1"` | its content, escapes decoded: `"a\"b"` is the key `a"b` |
/// | one bare key of token or UUID characters (letters, digits, ``! # $ % & ' * + - . ^ _ ` \| ~ : /``), `k-1` | itself, and the same key as `"k-1"` (for clients that send bare keys, as Stripe's do) |
/// | more than one field | refused: one field only |
/// | an sf-string with parameters (`"k";a=1`) or a list (`"a", "b"`) | refused: one key only |
/// | unbalanced quotes (`"abc`, `abc"`), a comma, a space, a `;`, a control character or a non-ASCII byte outside quotes | refused, naming the character and its place |
/// | an invalid sf-string (a control character or a non-ASCII byte inside the quotes, a `\` before anything but `"` or `\`) | refused, with the parser's reason |
/// | an empty key (`""`), or over [`Key::MAX_PART_LEN`](crate::Key::MAX_PART_LEN) bytes once decoded | refused, naming the limit |
///
/// Spaces before and after the value are ignored (RFC 8941, section 4.2). Every refusal is
/// [`KeyInvalid`](Refusal::KeyInvalid) with a detail naming the rule broken.
///
/// ```
/// use idemstore::guard::{client_key, Refusal};
///
/// assert_eq!(client_key([&b"\"k-1\""[..]])?, Some(b"k-1".to_vec()));
/// assert_eq!(client_key([&b"k-1"[..]])?, Some(b"k-1".to_vec()));
/// assert_eq!(client_key([&br#""a\"b""#[..]])?, Some(br#"a"b"#.to_vec()));
/// assert_eq!(client_key(Vec::<&[u8]>::new())?, None);
/// let twice = client_key([&b"a"[..], b"b"]).unwrap_err();
/// assert_eq!(twice.refusal, Refusal::KeyInvalid);
/// let list = client_key([&b"key,with,commas"[..]]).unwrap_err();
/// assert!(list.detail.contains("comma"), "{}", list.detail);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// A [`Refused`] with [`Refusal::KeyInvalid`] and a detail naming the rule broken.
pub fn client_key<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<Vec<u8>>, Refused> {
    let mut values = values.into_iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(invalid(
            "send one Idempotency-Key header field, not several: the key is one sf-string \
             (RFC 8941)"
                .into(),
        ));
    }
    let value = trim_spaces(value);
    let id = match value.first() {
        Some(b'"') => match unescaped_string(value) {
            Some(id) => id.to_vec(),
            None => sf_string(value)?,
        },
        _ => bare(value)?.to_vec(),
    };
    sized(id).map(Some)
}

/// A key that is not a header field but a field of a request message (the gRPC request id of
/// AIP-155): taken as it is, only refused when empty or over
/// [`Key::MAX_PART_LEN`](crate::Key::MAX_PART_LEN) bytes.
///
/// # Errors
/// A [`Refused`] with [`Refusal::KeyInvalid`] naming the limit broken.
pub fn plain_key(id: &[u8]) -> Result<Vec<u8>, Refused> {
    sized(id.to_vec())
}

fn invalid(detail: String) -> Refused {
    Refused::with_detail(Refusal::KeyInvalid, detail)
}

/// `id` if it is neither empty nor over the limit.
fn sized(id: Vec<u8>) -> Result<Vec<u8>, Refused> {
    if id.is_empty() {
        return Err(invalid("the Idempotency-Key is empty".into()));
    }
    if id.len() > Key::MAX_PART_LEN {
        return Err(invalid(format!(
            "the Idempotency-Key is {} bytes long; at most {} bytes are accepted",
            id.len(),
            Key::MAX_PART_LEN
        )));
    }
    Ok(id)
}

/// `value` without the spaces before and after it (RFC 8941 discards them; a tab is not a
/// space there).
pub fn trim_spaces(value: &[u8]) -> &[u8] {
    let start = value.iter().position(|&b| b != b' ').unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|&b| b != b' ')
        .map_or(start, |i| i + 1);
    &value[start..end]
}

/// The content of `value` when it is a quoted string without escapes, the usual key, read
/// without the parser: RFC 8941 reads `"` then `unescaped` characters (printable ASCII but `"`
/// and `\`) then `"` as exactly the characters between the quotes. Anything else (an escape, a
/// second string, parameters, a list) is `None`, for [`sf_string`].
pub fn unescaped_string(value: &[u8]) -> Option<&[u8]> {
    let inner = value.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    let unescaped = |b: &u8| matches!(b, 0x20..=0x21 | 0x23..=0x5b | 0x5d..=0x7e);
    inner.iter().all(unescaped).then_some(inner)
}

/// The content of `value`, one sf-string (RFC 8941, section 3.3.3) and nothing else.
pub fn sf_string(value: &[u8]) -> Result<Vec<u8>, Refused> {
    let parse = || sfv::Parser::new(value).with_version(sfv::Version::Rfc8941);
    let error = match parse().parse_item::<sfv::Item>() {
        Ok(item) if !item.params.is_empty() => {
            return Err(invalid(
                "the Idempotency-Key has parameters (`;name=value` after the string); send \
                 the key alone, one sf-string (RFC 8941)"
                    .into(),
            ))
        }
        Ok(item) => match item.bare_item.as_string() {
            Some(string) => return Ok(string.as_str().as_bytes().to_vec()),
            // Unreachable: a value starting with a quote parses as a string or fails.
            None => String::from("not a string"),
        },
        Err(error) => error.to_string(),
    };
    if let Ok(list) = parse().parse_list::<sfv::List>() {
        if list.len() > 1 {
            return Err(invalid(format!(
                "the Idempotency-Key is a list of {} members; send one key, one sf-string \
                 (RFC 8941)",
                list.len()
            )));
        }
    }
    Err(invalid(format!(
        "the Idempotency-Key is not a valid sf-string (RFC 8941): {error} (quotes balanced, \
         printable ASCII inside, only \\\" and \\\\ escaped)"
    )))
}

/// `value` as a bare key: only characters of a token or a UUID.
fn bare(value: &[u8]) -> Result<&[u8], Refused> {
    let Some(at) = value.iter().position(|&b| !is_bare_char(b)) else {
        return Ok(value);
    };
    let what = match value[at] {
        b'"' => "an unbalanced quote".to_owned(),
        b',' => "a comma (a list of keys is not a key)".to_owned(),
        b' ' => "a space".to_owned(),
        b';' => "a `;` (parameters are not accepted)".to_owned(),
        b @ (0..=0x1f | 0x7f) => format!("the control character 0x{b:02x}"),
        b @ 0x80.. => format!("the non-ASCII byte 0x{b:02x}"),
        b => format!("the character `{}`", char::from(b)),
    };
    Err(invalid(format!(
        "the Idempotency-Key has {what} at byte {at}; send one sf-string (RFC 8941) such as \
         \"k-1\" (a comma or space inside the quotes is part of the key), or a bare key of \
         token or UUID characters only (letters, digits and ! # $ % & ' * + - . ^ _ ` | ~ : /)"
    )))
}

/// A character of an RFC 8941 token (`tchar`, `:` and `/`), which covers UUIDs.
fn is_bare_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b)
}

/// The stored key of a request: (scope, operation, client key). A scope or operation longer
/// than [`Key::MAX_PART_LEN`](crate::Key::MAX_PART_LEN) bytes is replaced by `#` and the hex of
/// its BLAKE3 digest, so long paths and tokens still make distinct keys.
///
/// # Errors
/// [`NoScope`](Refusal::NoScope) when `scope` is `None` or empty;
/// [`KeyInvalid`](Refusal::KeyInvalid) when the key is refused by [`Key::new`].
pub fn request_key(scope: Option<Vec<u8>>, operation: &[u8], id: &[u8]) -> Result<Key, Refused> {
    let Some(scope) = scope.filter(|scope| !scope.is_empty()) else {
        return Err(Refused::new(Refusal::NoScope));
    };
    Key::new(bounded(&scope), bounded(operation), id)
        .map_err(|error| Refused::with_detail(Refusal::KeyInvalid, error.to_string()))
}

/// `part` itself when it fits in a key, else `#` and the hex of its BLAKE3 digest.
fn bounded(part: &[u8]) -> Cow<'_, [u8]> {
    if part.len() <= Key::MAX_PART_LEN {
        return Cow::Borrowed(part);
    }
    let mut out = b"#".to_vec();
    for byte in Fingerprint::of(part).as_bytes() {
        out.extend_from_slice(format!("{byte:02x}").as_bytes());
    }
    Cow::Owned(out)
}
