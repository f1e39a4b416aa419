//! Keeps a running handler's lease alive: without it, a handler that runs longer than the
//! store's lease would see its key taken over by a duplicate, and the work would run twice.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use crate::{Error, Lease, Reservations};

/// A renewal under way.
type Renewal<'a> = Pin<Box<dyn Future<Output = Result<Lease, Error>> + Send + 'a>>;

/// The shortest time between two extensions.
const MIN_PERIOD: Duration = Duration::from_millis(10);

/// Runs `work` to completion; meanwhile, every third of the lease, renews `lease` with
/// [`Reservations::extend`]. A failed renewal (the key was taken over, or the store failed)
/// stops the renewals, not the work: completing will then report the lost lease.
///
/// No timer is made for work that finishes at its first poll (a handler that answers without
/// waiting): the renewals start when the work first waits. The period comes from the lease's
/// own deadline, read against the system clock then; a deadline already past (or a store on a
/// manual clock far from it) means no renewals. The timer is tokio's, so the runtime must have
/// timers enabled (`enable_time`, or `enable_all` as `#[tokio::main]` does).
///
/// A named future rather than an `async fn`, so the work's future is held once, where it is
/// polled (an `async fn` would keep the argument and its pinned copy).
pub(crate) fn while_running<'a, R, F>(
    store: &'a R,
    lease: &'a Lease,
    work: F,
) -> WhileRunning<'a, R, F>
where
    R: Reservations,
    F: Future,
{
    WhileRunning {
        work,
        store,
        lease,
        renewals: None,
    }
}

pin_project_lite::pin_project! {
    /// [`while_running`]'s future.
    pub(crate) struct WhileRunning<'a, R, F> {
        #[pin]
        work: F,
        store: &'a R,
        lease: &'a Lease,
        renewals: Option<Renewals<'a>>,
    }
}

impl<'a, R: Reservations, F: Future> Future for WhileRunning<'a, R, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        if let Poll::Ready(output) = this.work.poll(cx) {
            return Poll::Ready(output);
        }
        let lease: &'a Lease = this.lease;
        let renewals = this.renewals.get_or_insert_with(|| Renewals::start(lease));
        renewals.poll(*this.store, lease, cx);
        Poll::Pending
    }
}

/// The renewals of one running request's lease, made when its work first waits.
struct Renewals<'a> {
    /// `None`: no renewals (the lease had run out already).
    period: Option<Duration>,
    tick: Option<Pin<Box<tokio::time::Sleep>>>,
    renewing: Option<Renewal<'a>>,
    stopped: bool,
}

impl<'a> Renewals<'a> {
    fn start(lease: &Lease) -> Renewals<'a> {
        let left = lease
            .lease_until()
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        let period = (!left.is_zero()).then(|| (left / 3).max(MIN_PERIOD));
        Renewals {
            period,
            tick: period.map(|period| Box::pin(tokio::time::sleep(period))),
            renewing: None,
            stopped: period.is_none(),
        }
    }

    /// Drives the timer and the renewal under way, starting one at each tick.
    fn poll<R: Reservations>(&mut self, store: &'a R, lease: &'a Lease, cx: &mut Context<'_>) {
        let (Some(period), Some(tick)) = (self.period, self.tick.as_mut()) else {
            return;
        };
        if let Some(renewal) = self.renewing.as_mut() {
            if let Poll::Ready(result) = renewal.as_mut().poll(cx) {
                self.renewing = None;
                self.stopped = result.is_err();
            }
        }
        while !self.stopped && self.renewing.is_none() && tick.as_mut().poll(cx).is_ready() {
            tick.as_mut().reset(tokio::time::Instant::now() + period);
            let mut renewal = Box::pin(store.extend(lease));
            match renewal.as_mut().poll(cx) {
                Poll::Pending => self.renewing = Some(renewal),
                Poll::Ready(result) => self.stopped = result.is_err(),
            }
        }
    }
}
