//! [`Refusal`] and [`Refused`]: why a request is answered by the guard itself, as an outcome
//! an adapter turns into its own answer (an HTTP status and problem, a gRPC status).

use std::fmt;
use std::time::Duration;

/// Why the guard answered a request itself instead of running (or replaying) the handler.
///
/// The HTTP layer answers each as an RFC 9457 problem: a JSON object with `type`, `title`,
/// `status` and `detail`, and for the size refusals a `limit` member (bytes). `type` is
/// [`problem_base`](crate::http::IdempotencyLayer::problem_base) followed by the refusal's
/// [`slug`](Refusal::slug). The HTTP status of each is given below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// No `Idempotency-Key` on a guarded method (400, unless configured to pass through).
    KeyMissing,
    /// The key is not one sf-string or bare token ([`client_key`](crate::guard::client_key)'s
    /// rules), is sent in more than one field, is empty, or is longer than
    /// [`Key::MAX_PART_LEN`](crate::Key::MAX_PART_LEN) bytes (400).
    KeyInvalid,
    /// The scope extractor found no scope (user, tenant) for the request (401).
    NoScope,
    /// The request body is over the fingerprinting limit (413 by default).
    BodyTooLarge,
    /// The request body could not be read (400).
    BodyUnreadable,
    /// A request with this key is still running (409, with `Retry-After`).
    InProgress,
    /// The key was used before with another request (422).
    KeyReused,
    /// The key is held for a person to review (409).
    UnderReview,
    /// The idempotency store failed (503, with `Retry-After`).
    StoreUnavailable,
    /// The stored response for the key does not decode (500).
    StoredResponseUnreadable,
    /// The handler's response body failed while it was read for storing (500); the key is
    /// released.
    ResponseUnreadable,
    /// The first request with this key was answered, but its response was streamed to its
    /// client and not stored (a body of unknown length, or over
    /// [`max_stored_response`](crate::guard::Guard::max_stored_response)), so it cannot be
    /// replayed (410 Gone: the work is done, retrying will not bring the response back). The
    /// detail names the first response's status.
    ResponseNotStored,
}

impl Refusal {
    /// The last part of the problem `type`, e.g. `key-missing`.
    pub fn slug(self) -> &'static str {
        match self {
            Refusal::KeyMissing => "key-missing",
            Refusal::KeyInvalid => "key-invalid",
            Refusal::NoScope => "no-scope",
            Refusal::BodyTooLarge => "body-too-large",
            Refusal::BodyUnreadable => "body-unreadable",
            Refusal::InProgress => "in-progress",
            Refusal::KeyReused => "key-reused",
            Refusal::UnderReview => "under-review",
            Refusal::StoreUnavailable => "store-unavailable",
            Refusal::StoredResponseUnreadable => "stored-response-unreadable",
            Refusal::ResponseUnreadable => "response-unreadable",
            Refusal::ResponseNotStored => "response-not-stored",
        }
    }

    /// The problem's `title`: the same for every occurrence of the refusal.
    pub fn title(self) -> &'static str {
        match self {
            Refusal::KeyMissing => "Idempotency-Key is missing",
            Refusal::KeyInvalid => "Idempotency-Key is invalid",
            Refusal::NoScope => "No scope for the Idempotency-Key",
            Refusal::BodyTooLarge => "Request body too large",
            Refusal::BodyUnreadable => "Request body unreadable",
            Refusal::InProgress => "A request is outstanding for this Idempotency-Key",
            Refusal::KeyReused => "Idempotency-Key is already used",
            Refusal::UnderReview => "The request for this Idempotency-Key is under review",
            Refusal::StoreUnavailable => "Idempotency store unavailable",
            Refusal::StoredResponseUnreadable => "Stored response unreadable",
            Refusal::ResponseUnreadable => "Response unreadable",
            Refusal::ResponseNotStored => "The response for this Idempotency-Key was not stored",
        }
    }

    /// The sentence the guard gives as the refusal's detail when it has nothing more
    /// particular to say (the key refusals and the size refusal say what is wrong instead).
    pub fn default_detail(self) -> &'static str {
        match self {
            Refusal::KeyMissing => {
                "This operation is idempotent and it requires correct usage of Idempotency \
                 Key: send an Idempotency-Key header."
            }
            Refusal::KeyInvalid => "the Idempotency-Key is invalid",
            Refusal::NoScope => "the request carries no identity to scope its Idempotency-Key by",
            Refusal::BodyTooLarge => "the request body is over the most this operation reads",
            Refusal::BodyUnreadable => "the request body could not be read",
            Refusal::InProgress => {
                "A request with the same Idempotency-Key for the same operation is being \
                 processed or is outstanding."
            }
            Refusal::KeyReused => {
                "This operation is idempotent and it requires correct usage of Idempotency \
                 Key. Idempotency Key MUST not be reused across different payloads of this \
                 operation."
            }
            Refusal::UnderReview => {
                "The outcome of the first request with this key is being checked."
            }
            Refusal::StoreUnavailable => "the idempotency store failed; retry later",
            Refusal::StoredResponseUnreadable => "the stored response for this key does not decode",
            Refusal::ResponseUnreadable => "the handler's response body failed while it was read",
            Refusal::ResponseNotStored => {
                "the response to the first request with this key was streamed and not stored; \
                 it cannot be replayed"
            }
        }
    }
}

/// A refusal with what the client is told: the outcome an adapter answers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Refused {
    /// Why.
    pub refusal: Refusal,
    /// A sentence for the client. It never holds a store error's text (which can name files).
    pub detail: String,
    /// When to retry: for [`InProgress`](Refusal::InProgress), the running request's lease
    /// left, capped by [`Guard::max_retry_after`](crate::guard::Guard::max_retry_after); for
    /// [`StoreUnavailable`](Refusal::StoreUnavailable), 1 s. `None` for the others.
    pub retry_after: Option<Duration>,
    /// The limit (bytes) the request went over, for [`BodyTooLarge`](Refusal::BodyTooLarge).
    pub limit: Option<usize>,
}

impl Refused {
    /// `refusal` with its [`default_detail`](Refusal::default_detail).
    pub fn new(refusal: Refusal) -> Refused {
        Refused::with_detail(refusal, refusal.default_detail())
    }

    /// `refusal` with a detail of the caller's.
    pub fn with_detail(refusal: Refusal, detail: impl Into<String>) -> Refused {
        let retry_after = match refusal {
            Refusal::StoreUnavailable => Some(Duration::from_secs(1)),
            _ => None,
        };
        Refused {
            refusal,
            detail: detail.into(),
            retry_after,
            limit: None,
        }
    }

    /// [`BodyTooLarge`](Refusal::BodyTooLarge) naming `limit`.
    pub fn body_too_large(limit: usize) -> Refused {
        let detail =
            format!("the request body is over {limit} bytes, the most this operation reads");
        Refused {
            limit: Some(limit),
            ..Refused::with_detail(Refusal::BodyTooLarge, detail)
        }
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.refusal.title(), self.detail)
    }
}

impl std::error::Error for Refused {}
