//! Keeps a running handler's lease alive: without it, a handler that runs longer than the
//! store's lease would see its key taken over by a duplicate, and the work would run twice.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::task::Poll;
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
/// The period comes from the lease's own deadline, read against the system clock when the
/// work starts; a deadline already past (or a store on a manual clock far from it) means no
/// renewals. The timer is tokio's, so the runtime must have timers enabled (`enable_time`, or
/// `enable_all` as `#[tokio::main]` does).
pub(crate) async fn while_running<R, F>(store: &R, lease: &Lease, work: F) -> F::Output
where
    R: Reservations,
    F: Future,
{
    let left = lease
        .lease_until()
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO);
    if left.is_zero() {
        return work.await;
    }
    let period = (left / 3).max(MIN_PERIOD);
    let mut work = pin!(work);
    let mut tick = pin!(tokio::time::sleep(period));
    let mut renewing: Option<Renewal<'_>> = None;
    let mut stopped = false;
    poll_fn(|cx| {
        if let Poll::Ready(output) = work.as_mut().poll(cx) {
            return Poll::Ready(output);
        }
        if let Some(renewal) = renewing.as_mut() {
            if let Poll::Ready(result) = renewal.as_mut().poll(cx) {
                renewing = None;
                stopped = result.is_err();
            }
        }
        while !stopped && renewing.is_none() && tick.as_mut().poll(cx).is_ready() {
            tick.as_mut().reset(tokio::time::Instant::now() + period);
            let mut renewal = Box::pin(store.extend(lease));
            match renewal.as_mut().poll(cx) {
                Poll::Pending => renewing = Some(renewal),
                Poll::Ready(result) => stopped = result.is_err(),
            }
        }
        Poll::Pending
    })
    .await
}
