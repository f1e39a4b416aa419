//! Refusals as gRPC statuses with the standard `google.rpc` details.

use std::collections::HashMap;

use http::Response;
use tonic::body::Body;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::grpc::key::KeySource;
use crate::guard::{Refusal, Refused};

/// The `domain` of every refusal's `google.rpc.ErrorInfo`.
pub const ERROR_DOMAIN: &str = "idemstore";

/// The status code of each refusal; see the [module docs](crate::grpc).
pub fn code_of(refusal: Refusal) -> Code {
    match refusal {
        Refusal::KeyMissing | Refusal::KeyInvalid | Refusal::BodyUnreadable => {
            Code::InvalidArgument
        }
        Refusal::NoScope => Code::Unauthenticated,
        Refusal::BodyTooLarge => Code::ResourceExhausted,
        Refusal::InProgress => Code::Aborted,
        Refusal::KeyReused | Refusal::UnderReview | Refusal::ResponseNotStored => {
            Code::FailedPrecondition
        }
        Refusal::StoreUnavailable => Code::Unavailable,
        Refusal::StoredResponseUnreadable | Refusal::ResponseUnreadable => Code::Internal,
    }
}

/// The message a gRPC client reads for a refusal. The guard's own sentences speak of an
/// `Idempotency-Key` header and a request body, as HTTP does; these speak of the RPC, its
/// request and the metadata entry or field that carried the key. The refusals the layer words
/// itself (a missing or invalid key, a request id that cannot be read) keep their detail.
fn message(refused: &Refused, source: &KeySource) -> String {
    let name = source.field();
    let carrier = source.carrier();
    match refused.refusal {
        Refusal::NoScope => {
            format!("the request carries no identity (metadata) to scope its {carrier} by")
        }
        Refusal::BodyTooLarge => match refused.limit {
            Some(limit) => format!(
                "the request is over {limit} bytes (its encoded messages), the most this RPC \
                 reads; its {name} was not reserved"
            ),
            None => refused.detail.clone(),
        },
        Refusal::InProgress => format!(
            "a request with the same {name} is still running; retry after the delay given in \
             its RetryInfo"
        ),
        Refusal::KeyReused => format!(
            "this {name} was already used with a different request to this RPC; a new request \
             needs a new {name}"
        ),
        Refusal::UnderReview => format!(
            "the first request with this {name} is held for review; its outcome is being checked"
        ),
        Refusal::StoreUnavailable => "the idempotency store failed; retry later".to_owned(),
        Refusal::StoredResponseUnreadable => {
            format!("the stored answer to the first request with this {name} does not decode")
        }
        Refusal::ResponseUnreadable => format!(
            "the answer of the RPC failed while it was read; the {name} is released, so a retry \
             runs the RPC again"
        ),
        Refusal::ResponseNotStored => format!(
            "the answer to the first request with this {name} was over the most the layer \
             stores, so it cannot be replayed; its work is done and is not run again"
        ),
        _ => refused.detail.clone(),
    }
}

/// The refusal as a status: its code, a [message](message) naming the key's metadata entry or
/// field, and as details an `ErrorInfo` (reason: the refusal's slug in upper snake case, e.g.
/// `IN_PROGRESS`), a `RetryInfo` when the guard gave a delay, a `BadRequest` naming the key's
/// field for the key refusals and a `PreconditionFailure` for a reused key or one under review.
pub(crate) fn refusal_status(refused: &Refused, source: &KeySource) -> Status {
    let field = source.field();
    let message = message(refused, source);
    let mut details = ErrorDetails::new();
    let reason = refused.refusal.slug().replace('-', "_").to_uppercase();
    let mut metadata = HashMap::new();
    if let Some(limit) = refused.limit {
        metadata.insert("limit".to_owned(), limit.to_string());
    }
    details.set_error_info(reason, ERROR_DOMAIN, metadata);
    if let Some(delay) = refused.retry_after {
        details.set_retry_info(Some(delay));
    }
    match refused.refusal {
        Refusal::KeyMissing | Refusal::KeyInvalid => {
            details.add_bad_request_violation(field, &message);
        }
        Refusal::KeyReused | Refusal::UnderReview => {
            details.add_precondition_failure_violation(
                refused.refusal.slug().replace('-', "_").to_uppercase(),
                field,
                &message,
            );
        }
        _ => {}
    }
    Status::with_error_details(code_of(refused.refusal), message, details)
}

/// [`refusal_status`] as a trailers-only response.
pub(crate) fn refusal_response(refused: &Refused, source: &KeySource) -> Response<Body> {
    refusal_status(refused, source).into_http()
}
