//! What the cluster stores' read-only snapshots share: counting and listing the records a
//! snapshot visits, each classed at the moment it was taken.

use std::future::Future;

use crate::error::Error;
use crate::key::Key;
use crate::record::{Millis, Record, RecordClass, TokenFloor};
use crate::store::inspect::{self, ScanFilter, StateCounts};

/// A snapshot's dialect: its moment, and its records visited in key order.
pub(crate) trait Records {
    /// When the snapshot was taken.
    fn taken(&self) -> Millis;

    /// Calls `visit` with every record in key order (the key `None` when it does not decode,
    /// the record `None` when it does not), page by page, until it returns `false`.
    fn each_record(
        &self,
        visit: impl FnMut(Option<Key>, Option<Record>) -> bool,
    ) -> impl Future<Output = Result<(), Error>>;
}

/// The [`RecordClass`] of `record` at `now`. Several processes share a cluster store: a lease
/// lasts its time, whoever acquired it.
pub(crate) fn class_of(now: Millis, record: &Record) -> RecordClass {
    record.class(now, TokenFloor::NONE)
}

/// The records in each class, the damaged ones apart.
pub(crate) async fn counts<R: Records>(records: &R) -> Result<StateCounts, Error> {
    let now = records.taken();
    let mut counts = StateCounts::default();
    records
        .each_record(|key, record| {
            let (Some(key), Some(record)) = (key, record) else {
                counts.damaged += 1;
                return true;
            };
            counts.count(class_of(now, &record), key, record);
            true
        })
        .await?;
    Ok(counts)
}

/// Up to `limit` records that match `filter`, in the order of
/// [`Store::scan`](crate::Store::scan); the damaged ones skipped.
pub(crate) async fn scan<R: Records>(
    records: &R,
    filter: &ScanFilter,
    limit: usize,
) -> Result<Vec<(Key, Record)>, Error> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let now = records.taken();
    let mut listing = inspect::Listing::new(filter, limit);
    records
        .each_record(|key, record| match (key, record) {
            (Some(key), Some(record)) => {
                let class = class_of(now, &record);
                listing.offer(key, record, class, now)
            }
            _ => true,
        })
        .await?;
    Ok(listing.finish())
}
