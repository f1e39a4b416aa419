//! [`ReleaseGuard`]: the key of a request that never finished is released, not left pending.

use std::future::Future;
use std::sync::Arc;

use crate::guard::waiting::Watch;
use crate::{Lease, Reservations};

/// Holds the lease of a request whose handler runs. Unless [`disarm`](Self::disarm)ed after the
/// response was stored, or [`release`](Self::release)d, dropping it releases the key if it is
/// still pending under this lease.
///
/// A request future is dropped before it completes when the client disconnects (the server
/// drops the connection's work) or when the handler panics (the unwinding drops it). Without
/// the guard the key would stay pending until its lease ran out, answering every retry with
/// 409. The release runs on the tokio runtime the request ran on; outside a tokio runtime
/// nothing can run it, and the store's lease is the backstop: the key goes stale and the next
/// request takes it over with `attempt + 1`.
///
/// Releasing cannot undo a completion: `release_if_pending` deletes the key only while this
/// lease still holds it pending, so a response stored before the drop stays stored.
pub(crate) struct ReleaseGuard<R: Reservations + 'static> {
    store: Arc<R>,
    lease: Option<Lease>,
    /// Wakes the duplicates waiting for this request once the key is completed or released.
    watch: Option<Watch>,
}

impl<R: Reservations + 'static> ReleaseGuard<R> {
    pub(crate) fn new(store: Arc<R>, lease: Lease) -> ReleaseGuard<R> {
        ReleaseGuard {
            store,
            lease: Some(lease),
            watch: None,
        }
    }

    /// Wakes `watch`'s waiters when the key is completed or released.
    pub(crate) fn watched(mut self, watch: Option<Watch>) -> ReleaseGuard<R> {
        self.watch = watch;
        self
    }

    /// The store the lease is held in.
    pub(crate) fn store(&self) -> &R {
        &self.store
    }

    /// The lease held.
    pub(crate) fn lease(&self) -> &Lease {
        self.lease
            .as_ref()
            .expect("held until disarmed or released")
    }

    /// The response was stored: nothing left to release.
    pub(crate) fn disarm(mut self) {
        self.lease = None;
        if let Some(watch) = self.watch.take() {
            watch.finish();
        }
    }

    /// Releases the key now. The lease stays held while the release runs, so if this future
    /// is dropped half-way the drop releases again (a second release changes nothing).
    #[allow(clippy::manual_async_fn)] // `self` held once in the future, not twice.
    pub(crate) fn release(mut self) -> impl Future<Output = ()> {
        async move {
            if let Some(lease) = &self.lease {
                let result = self.store.release_if_pending(lease).await;
                self.lease = None;
                report(result);
                if let Some(watch) = self.watch.take() {
                    watch.finish();
                }
            }
        }
    }
}

impl<R: Reservations + 'static> Drop for ReleaseGuard<R> {
    fn drop(&mut self) {
        let watch = self.watch.take();
        let Some(lease) = self.lease.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let store = Arc::clone(&self.store);
            runtime.spawn(async move {
                report(store.release_if_pending(&lease).await);
                if let Some(watch) = watch {
                    watch.finish();
                }
            });
        } else if let Some(watch) = watch {
            // No release: the waiters find the key pending and stop waiting (409).
            watch.finish();
        }
    }
}

fn report(result: Result<bool, crate::Error>) {
    #[cfg(feature = "tracing")]
    if let Err(error) = &result {
        tracing::warn!(%error, "idempotency key not released; its lease will run out");
    }
    let _ = result;
}
