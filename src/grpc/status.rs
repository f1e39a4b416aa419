//! Refusals as gRPC statuses with the standard `google.rpc` details.

use std::collections::HashMap;

use http::Response;
use tonic::body::Body;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

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

/// The refusal as a status: its code, the detail as the message, and as details an
/// `ErrorInfo` (reason: the refusal's slug in upper snake case, e.g. `IN_PROGRESS`), a
/// `RetryInfo` when the guard gave a delay, a `BadRequest` naming the key's field for the key
/// refusals and a `PreconditionFailure` for a reused key or one under review.
pub(crate) fn refusal_status(refused: &Refused, field: &str) -> Status {
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
            details.add_bad_request_violation(field, &refused.detail);
        }
        Refusal::KeyReused | Refusal::UnderReview => {
            details.add_precondition_failure_violation(
                refused.refusal.slug().replace('-', "_").to_uppercase(),
                field,
                &refused.detail,
            );
        }
        _ => {}
    }
    Status::with_error_details(code_of(refused.refusal), &refused.detail, details)
}

/// [`refusal_status`] as a trailers-only response.
pub(crate) fn refusal_response(refused: &Refused, field: &str) -> Response<Body> {
    refusal_status(refused, field).into_http()
}
