//! Reading the client's key and building the stored [`Key`] from it, its scope and operation.

use crate::guard::{Refusal, Refused};
use crate::{Fingerprint, Key, MAX_KEY_PART_LEN};

/// The client's key from the values it sent (the `Idempotency-Key` header's, say): one value,
/// a quoted structured-field string (`"abc"`, as the IETF draft writes it) or a bare token
/// (`abc`, as most clients send it).
///
/// `Ok(None)` when no value was sent; [`KeyInvalid`](Refusal::KeyInvalid) naming what is
/// wrong when the key is empty, sent more than once, or over
/// [`MAX_KEY_PART_LEN`](crate::MAX_KEY_PART_LEN) bytes.
///
/// ```
/// use idemstore::guard::{client_key, Refusal};
///
/// assert_eq!(client_key([&b"\"k-1\""[..]])?, Some(b"k-1".to_vec()));
/// assert_eq!(client_key([&b"k-1"[..]])?, Some(b"k-1".to_vec()));
/// assert_eq!(client_key(Vec::<&[u8]>::new())?, None);
/// let twice = client_key([&b"a"[..], b"b"]).unwrap_err();
/// assert_eq!(twice.refusal, Refusal::KeyInvalid);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// A [`Refused`] with [`Refusal::KeyInvalid`] and a detail naming the limit broken.
pub fn client_key<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<Vec<u8>>, Refused> {
    let invalid = |detail: String| Refused::with_detail(Refusal::KeyInvalid, detail);
    let mut values = values.into_iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(invalid(
            "send one Idempotency-Key header, not several".into(),
        ));
    }
    let id = match value {
        [b'"', inner @ .., b'"'] => inner,
        other => other,
    };
    if id.is_empty() {
        return Err(invalid("the Idempotency-Key is empty".into()));
    }
    if id.len() > MAX_KEY_PART_LEN {
        return Err(invalid(format!(
            "the Idempotency-Key is {} bytes long; at most {MAX_KEY_PART_LEN} bytes are accepted",
            id.len()
        )));
    }
    Ok(Some(id.to_vec()))
}

/// The stored key of a request: (scope, operation, client key). A scope or operation longer
/// than [`MAX_KEY_PART_LEN`](crate::MAX_KEY_PART_LEN) bytes is replaced by `#` and the hex of
/// its BLAKE3 digest, so long paths and tokens still make distinct keys.
///
/// # Errors
/// [`NoScope`](Refusal::NoScope) when `scope` is `None` or empty;
/// [`KeyInvalid`](Refusal::KeyInvalid) when the key is refused by [`Key::new`].
pub fn request_key(scope: Option<Vec<u8>>, operation: &[u8], id: &[u8]) -> Result<Key, Refused> {
    let Some(scope) = scope.filter(|scope| !scope.is_empty()) else {
        return Err(Refused::new(Refusal::NoScope));
    };
    Key::new(bounded(scope), bounded(operation.to_vec()), id)
        .map_err(|error| Refused::with_detail(Refusal::KeyInvalid, error.to_string()))
}

/// `part` itself when it fits in a key, else `#` and the hex of its BLAKE3 digest.
fn bounded(part: Vec<u8>) -> Vec<u8> {
    if part.len() <= MAX_KEY_PART_LEN {
        return part;
    }
    let mut out = b"#".to_vec();
    for byte in Fingerprint::of(&part).as_bytes() {
        out.extend_from_slice(format!("{byte:02x}").as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail(values: &[&[u8]]) -> String {
        client_key(values.iter().copied()).unwrap_err().detail
    }

    #[test]
    fn keys_are_read_quoted_or_bare_and_refused_with_the_limit() {
        assert_eq!(client_key([]), Ok(None));
        assert_eq!(client_key([&b"\"k-1\""[..]]), Ok(Some(b"k-1".to_vec())));
        assert_eq!(client_key([&b"k-1"[..]]), Ok(Some(b"k-1".to_vec())));
        assert!(detail(&[b"\"\""]).contains("empty"));
        let error = detail(&[&[b'k'; 256]]);
        assert!(
            error.contains("256 bytes") && error.contains("255"),
            "{error}"
        );
        assert!(detail(&[b"a", b"b"]).contains("one"));
    }

    #[test]
    fn long_parts_are_replaced_by_their_digest() {
        let short = b"POST /orders".to_vec();
        assert_eq!(bounded(short.clone()), short);
        let a = bounded(vec![b'a'; 300]);
        let b = bounded([vec![b'a'; 299], vec![b'b']].concat());
        assert_eq!((a.len(), a[0]), (65, b'#'));
        assert_ne!(a, b, "distinct long parts stay distinct");
        assert!(Key::new(&a, "op", "id").is_ok());
    }

    #[test]
    fn no_scope_is_refused() {
        let refused = request_key(Some(Vec::new()), b"POST /x", b"k").unwrap_err();
        assert_eq!(refused.refusal, Refusal::NoScope);
        assert!(request_key(None, b"POST /x", b"k").is_err());
        assert!(request_key(Some(b"u".to_vec()), b"POST /x", b"k").is_ok());
    }
}
