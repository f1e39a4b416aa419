//! The client's key of a guarded RPC, as gRPC carries it: the value of the `idempotency-key`
//! metadata entry, read as the HTTP header is (an RFC 8941 sf-string or a bare token), or the
//! request message's `request_id` field, taken as it is (a message field has no quoting), with
//! refusals that name the entry or the field.

use std::sync::Arc;

use crate::grpc::IDEMPOTENCY_KEY;
use crate::guard::{client_key, Refusal, Refused};
use crate::Key;

/// Reads the request id from an encoded request message: `Ok(None)` when the field is empty,
/// `Err` with a sentence when the message does not decode.
pub(crate) type RequestIdFn = dyn Fn(&[u8]) -> Result<Option<Vec<u8>>, String> + Send + Sync;

/// Where a guarded RPC's key comes from.
#[derive(Clone)]
pub(crate) enum KeySource {
    /// The `idempotency-key` metadata entry.
    Metadata,
    /// A field of the request message (AIP-155's `request_id`), read by the extractor.
    RequestId(Arc<RequestIdFn>),
}

impl KeySource {
    /// The name of the key's field in refusal details: the metadata entry or the message field.
    pub(crate) fn field(&self) -> &'static str {
        match self {
            KeySource::Metadata => IDEMPOTENCY_KEY,
            KeySource::RequestId(_) => "request_id",
        }
    }

    /// What carried the key, for messages: the metadata entry or the message field.
    pub(crate) fn carrier(&self) -> String {
        match self {
            KeySource::Metadata => format!("{IDEMPOTENCY_KEY} metadata entry"),
            KeySource::RequestId(_) => "request_id field".to_owned(),
        }
    }
}

/// The key from the `idempotency-key` metadata values sent, read as the HTTP layer reads the
/// `Idempotency-Key` header ([`client_key`]: one RFC 8941 sf-string, or a bare key of token or
/// UUID characters, the same key as its quoted form), so a client that talks to both gets the
/// same keys; refusals name the metadata entry. `Ok(None)` when none was sent.
pub(crate) fn metadata_key<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<Vec<u8>>, Refused> {
    client_key(values).map_err(|mut refused| {
        refused.detail = refused
            .detail
            .replace(
                "Idempotency-Key header field",
                &format!("{IDEMPOTENCY_KEY} metadata entry"),
            )
            .replace(
                "Idempotency-Key",
                &format!("{IDEMPOTENCY_KEY} metadata entry"),
            );
        refused
    })
}

/// The key from a request id read from the request message: `None` when the field is empty;
/// [`KeyInvalid`](Refusal::KeyInvalid) when it is too long.
pub(crate) fn request_id_key(id: Option<Vec<u8>>, field: &str) -> Result<Option<Vec<u8>>, Refused> {
    match id {
        Some(id) => {
            checked_len(&id, &format!("the {field} field"))?;
            Ok(Some(id))
        }
        None => Ok(None),
    }
}

/// Refuses a key over [`Key::MAX_PART_LEN`] bytes, naming where it came from.
fn checked_len(id: &[u8], what: &str) -> Result<(), Refused> {
    if id.len() > Key::MAX_PART_LEN {
        return Err(invalid(format!(
            "{what} is {} bytes long; at most {} bytes are accepted",
            id.len(),
            Key::MAX_PART_LEN
        )));
    }
    Ok(())
}

fn invalid(detail: String) -> Refused {
    Refused::with_detail(Refusal::KeyInvalid, detail)
}
