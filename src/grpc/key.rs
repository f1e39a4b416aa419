//! The client's key of a guarded RPC, as gRPC carries it: the value of the `idempotency-key`
//! metadata entry or of the request message's `request_id` field, taken as it is (gRPC
//! metadata has no quoting, unlike HTTP's structured-field strings), with refusals that name
//! the entry or the field.

use crate::grpc::IDEMPOTENCY_KEY;
use crate::guard::{Refusal, Refused};
use crate::MAX_KEY_PART_LEN;

/// The key from the `idempotency-key` metadata values sent: `Ok(None)` when none was sent;
/// [`KeyInvalid`](Refusal::KeyInvalid) when it is empty, sent more than once or too long.
pub(crate) fn metadata_key<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<Vec<u8>>, Refused> {
    let mut values = values.into_iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(invalid(format!(
            "send one {IDEMPOTENCY_KEY} metadata entry, not several"
        )));
    }
    if value.is_empty() {
        return Err(invalid(format!(
            "the {IDEMPOTENCY_KEY} metadata entry is empty"
        )));
    }
    checked_len(value, &format!("the {IDEMPOTENCY_KEY} metadata entry"))?;
    Ok(Some(value.to_vec()))
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

/// Refuses a key over [`MAX_KEY_PART_LEN`] bytes, naming where it came from.
fn checked_len(id: &[u8], what: &str) -> Result<(), Refused> {
    if id.len() > MAX_KEY_PART_LEN {
        return Err(invalid(format!(
            "{what} is {} bytes long; at most {MAX_KEY_PART_LEN} bytes are accepted",
            id.len()
        )));
    }
    Ok(())
}

fn invalid(detail: String) -> Refused {
    Refused::with_detail(Refusal::KeyInvalid, detail)
}
