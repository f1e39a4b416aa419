//! [`Running`]: a request whose key this process holds while its handler runs.

use std::future::Future;
use std::sync::Arc;

use crate::guard::events::{count, Event};
use crate::guard::heartbeat;
use crate::guard::release::ReleaseGuard;
use crate::guard::stored;
use crate::guard::waiting::Watch;
use crate::{Error, Lease, Reservations};

/// Why a running request's key is released rather than completed; see [`Running::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Release {
    /// The handler answered, but with a response the adapter does not store (a 5xx by
    /// default): worth retrying, so a retry runs the handler again.
    NotStored,
    /// The handler failed (an error instead of a response, a response body that broke).
    Failed,
}

/// The key of one request, acquired by this process: run the handler under
/// [`work`](Running::work), then [`complete`](Running::complete) with the response to store,
/// or [`release`](Running::release) the key so a retry runs the handler again.
///
/// Dropping it before either (the client went away and the server dropped the request's
/// future, or the handler panicked) releases the key on the tokio runtime it is dropped on, so
/// a retry runs the handler at once; with no runtime (or a process that died) the store's lease
/// is the backstop: the key goes stale when it runs out and the next request takes it over.
pub struct Running<R: Reservations + 'static> {
    guard: ReleaseGuard<R>,
}

impl<R: Reservations + 'static> Running<R> {
    pub(crate) fn new(store: Arc<R>, lease: Lease, watch: Option<Watch>) -> Running<R> {
        Running {
            guard: ReleaseGuard::new(store, lease).watched(watch),
        }
    }

    /// The lease this request holds (its token, attempt, and whether it is a retry of a
    /// request whose lease ran out: [`Lease::is_retry`]).
    pub fn lease(&self) -> &Lease {
        self.guard.lease()
    }

    /// Runs `work` (the handler) to completion; meanwhile, every third of the lease, renews it
    /// with [`Reservations::extend`], so a handler that runs longer than the store's lease is
    /// not taken over by a duplicate. A failed renewal stops the renewals, not the work.
    ///
    /// The timer is tokio's: the runtime must have timers enabled.
    pub fn work<F: Future>(&self, work: F) -> impl Future<Output = F::Output> + use<'_, R, F> {
        heartbeat::while_running(self.guard.store(), self.guard.lease(), work)
    }

    /// Stores `result` as the key's response: every duplicate from now on gets it.
    ///
    /// A `result` the store refuses as too large ([`Error::ResultTooLarge`], over its
    /// [`max_result_len`](crate::Builder::max_result_len)) whose status can be read (a
    /// [`StoredResponse::encode`](crate::guard::StoredResponse::encode) layout) is replaced by
    /// the marker of [`complete_not_stored`](Self::complete_not_stored): the handler's work is
    /// done and must not run again, so a duplicate gets
    /// [`Refusal::ResponseNotStored`](crate::guard::Refusal::ResponseNotStored). The store's
    /// error is still returned.
    ///
    /// # Errors
    /// The store's error when the result is not stored: over the store's limit (the key then
    /// holds the marker, as above; or is released when the marker is not stored either or
    /// `result` has no readable status), the lease was lost, the store failed (the key is
    /// then released, so a retry runs the handler again). The client of this request should
    /// still get its answer.
    #[allow(clippy::manual_async_fn)] // `self` held once in the future, not twice.
    pub fn complete(self, result: Vec<u8>) -> impl Future<Output = Result<(), Error>> {
        async move {
            let status = stored::status(&result);
            let stored = self
                .guard
                .store()
                .complete(self.guard.lease(), result)
                .await;
            if let (Err(Error::ResultTooLarge { .. }), Some(status)) = (&stored, status) {
                count(Event::NotStored);
                #[cfg(feature = "tracing")]
                if let Err(error) = &stored {
                    tracing::warn!(%error, status, "response over the store's limit; the key is completed as not stored");
                }
                let marker = self
                    .guard
                    .store()
                    .complete(self.guard.lease(), stored::not_stored(status))
                    .await;
                if marker.is_ok() {
                    self.guard.disarm();
                    return stored;
                }
            }
            match stored {
                Ok(()) => {
                    self.guard.disarm();
                    Ok(())
                }
                Err(error) => {
                    #[cfg(feature = "tracing")]
                    tracing::warn!(%error, "response not stored; the key is released");
                    // Boxed: the usual path's future need not have room for the release's.
                    Box::pin(self.guard.release()).await;
                    Err(error)
                }
            }
        }
    }

    /// Releases the key now (if this lease still holds it pending): a retry runs the handler
    /// again.
    pub fn release(self, why: Release) -> impl Future<Output = ()> {
        count(match why {
            Release::NotStored => Event::ReleasedNotStored,
            Release::Failed => Event::ReleasedFailed,
        });
        self.guard.release()
    }

    /// Completes the key with a marker instead of the response: the response (with this
    /// status) was sent to its client but not stored, because it streams or is over
    /// [`Guard::max_stored_response`](crate::guard::Guard::max_stored_response). The handler's
    /// work is done, so it must not run again for this key; every duplicate gets
    /// [`Refusal::ResponseNotStored`](crate::guard::Refusal::ResponseNotStored) naming the
    /// status, until the key expires (or is deleted with
    /// [`Store::expire`](crate::Store::expire)).
    ///
    /// # Errors
    /// As for [`complete`](Self::complete); the key is then released.
    pub fn complete_not_stored(self, status: u16) -> impl Future<Output = Result<(), Error>> {
        count(Event::NotStored);
        self.complete(stored::not_stored(status))
    }
}
