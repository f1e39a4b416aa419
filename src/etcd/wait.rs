//! [`EtcdStore::reserve_or_wait`]: waiting for a key held by another caller (on any host)
//! through an etcd watch on its record, not by polling.

use std::time::Duration;

use etcd_client::WatchStream;
use tokio::time::Instant;

use super::store::EtcdStore;
use crate::answers::Reservation;
use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::key::Key;

/// The pause before a watch is opened again after the cluster refused or cut it.
const WATCH_RETRY: Duration = Duration::from_millis(100);

impl EtcdStore {
    /// Like [`reserve`](EtcdStore::reserve), but when another caller holds the key, waits
    /// until it completes, releases or goes stale, up to `timeout`; see
    /// [`Store::reserve_or_wait`](crate::Store::reserve_or_wait). Returns the stored result,
    /// an acquisition, or `InProgress` when the timeout passed.
    ///
    /// The wait is an etcd watch on the key's record, opened before the key is read again,
    /// so a change made by any instance on any host wakes it at once; it also wakes when the
    /// holder's lease runs out (the key can then be taken over). While a member is down the
    /// watch is opened again every 100 ms.
    ///
    /// # Errors
    /// As for [`reserve`](EtcdStore::reserve).
    pub async fn reserve_or_wait(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        timeout: Duration,
    ) -> Result<Reservation, Error> {
        let deadline = Instant::now() + timeout;
        let mut watch: Option<WatchStream> = None;
        loop {
            let answer = self.reserve(key, fingerprint).await?;
            let Reservation::InProgress { retry_after, .. } = answer else {
                return Ok(answer);
            };
            let now = Instant::now();
            if now >= deadline {
                return Ok(answer);
            }
            let left = deadline - now;
            let Some(stream) = watch.as_mut() else {
                // Watch first, then read again: a change in between is not missed.
                match tokio::time::timeout(left, self.watch(key)).await {
                    Ok(Some(stream)) => watch = Some(stream),
                    Ok(None) => tokio::time::sleep(left.min(WATCH_RETRY)).await,
                    Err(_) => {}
                }
                continue;
            };
            // Wake at the latest when the holder's lease runs out.
            let wait = left.min(retry_after + Duration::from_millis(1));
            match tokio::time::timeout(wait, stream.message()).await {
                // The key changed (or the watch reported progress): read it again.
                Ok(Ok(Some(_))) => {}
                // The watch ended (a member went down): open another.
                Ok(Ok(None) | Err(_)) => watch = None,
                // The lease may have run out.
                Err(_) => {}
            }
        }
    }

    /// A watch on `key`'s record, once the cluster confirmed it; `None` when it could not be
    /// opened.
    async fn watch(&self, key: &Key) -> Option<WatchStream> {
        let inner = self.inner();
        let mut client = inner.client.watch_client();
        let mut stream = client.watch(inner.layout.record(key), None).await.ok()?;
        match stream.message().await {
            Ok(Some(created)) if created.created() && !created.canceled() => Some(stream),
            _ => None,
        }
    }
}
