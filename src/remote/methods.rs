//! [`store_operations!`]: the public methods every cluster store offers, documented once.

/// Writes a cluster store's public operations, each calling its function in
/// [`remote`](crate::remote) on the store's backend (`self.inner()`):
///
/// ```text
/// store_operations!(EtcdStore {
///     failure: "Cluster",                                  // the error of no definite answer
///     durable: "a majority of the cluster's members wrote it to disk",
///     batch: "transactions",                               // what a batch is sent in
/// });
/// ```
macro_rules! store_operations {
    ($store:ident {
        failure: $failure:literal,
        durable: $durable:literal,
        batch: $batch:literal $(,)?
    }) => {
        impl $store {
            /// Reserves `key`; the answers of [`Store::reserve`](crate::Store::reserve). A key
            /// is guessed absent first: most keys reserved are new, and a wrong guess costs
            /// only the conditional write that finds the key.
            ///
            /// # Durability
            #[doc = concat!("`Acquired` is returned only after ", $durable, ".")]
            ///
            /// # Cancel safety
            /// Dropping the future does not withdraw a reservation already sent: it may be
            /// acquired, and then goes stale when its lease runs out.
            ///
            /// # Errors
            #[doc = concat!("[`StorageError::Corruption`](crate::StorageError::Corruption) for a damaged record; [`Error::", $failure, "`](crate::Error::", $failure, ")")]
            /// when no definite answer came within the operation deadline (saying whether the
            /// write may have landed: an acquisition nobody was told of goes stale when its
            /// lease runs out).
            pub async fn reserve(
                &self,
                key: &$crate::Key,
                fingerprint: $crate::Fingerprint,
            ) -> Result<$crate::Reservation, $crate::Error> {
                $crate::remote::reserve(self.inner(), key, fingerprint).await
            }

            /// Reserves many keys with few round trips; the answers of
            /// [`Store::reserve_many`](crate::Store::reserve_many), one per item, in order.
            #[doc = concat!("The keys are guessed absent and the acquisitions written together, in few ", $batch, ",")]
            /// each under its own compare; a key that changed meanwhile is read and decided
            /// again. A key that appears twice is decided again after the first was written,
            /// so the second sees the first's reservation.
            ///
            /// # Durability
            #[doc = concat!("As for [`reserve`](Self::reserve): every `Acquired` is returned only after ", $durable, ".")]
            ///
            /// # Errors
            #[doc = concat!("The outer error fails the whole batch ([`Error::", $failure, "`](crate::Error::", $failure, "));")]
            /// an item's error (a damaged record) does not fail the others.
            pub async fn reserve_many(
                &self,
                items: &[($crate::Key, $crate::Fingerprint)],
            ) -> Result<Vec<Result<$crate::Reservation, $crate::Error>>, $crate::Error> {
                $crate::remote::reserve_many(self.inner(), items).await
            }

            /// Stores the lease's result; see [`Store::complete`](crate::Store::complete).
            ///
            /// # Durability
            #[doc = concat!("Answered `Ok` only after ", $durable, ".")]
            ///
            /// # Errors
            /// [`Error::ResultTooLarge`](crate::Error::ResultTooLarge),
            #[doc = concat!("[`Error::LeaseLost`](crate::Error::LeaseLost), [`Error::", $failure, "`](crate::Error::", $failure, ").")]
            pub async fn complete(
                &self,
                lease: &$crate::Lease,
                result: Vec<u8>,
            ) -> Result<(), $crate::Error> {
                $crate::remote::complete(self.inner(), lease, result, None).await
            }

            /// [`complete`](Self::complete), keeping this key's result for `retention`
            /// instead of its operation's retention; see
            /// [`Store::complete_with_retention`](crate::Store::complete_with_retention). A
            /// zero retention stores the completion and lets the key read as absent at once.
            ///
            /// # Errors
            /// As for [`complete`](Self::complete).
            pub async fn complete_with_retention(
                &self,
                lease: &$crate::Lease,
                result: Vec<u8>,
                retention: std::time::Duration,
            ) -> Result<(), $crate::Error> {
                $crate::remote::complete(self.inner(), lease, result, Some(retention)).await
            }

            /// Records a recovery point for multi-step work; see
            /// [`Store::record_step`](crate::Store::record_step). The caller that takes the
            /// stale reservation over (on any host) finds it in
            /// [`Lease::progress`](crate::Lease::progress).
            ///
            /// ```no_run
            #[doc = concat!("use idemstore::{", stringify!($store), ", Fingerprint, Key, Reservation};")]
            ///
            #[doc = concat!("# async fn run(store: ", stringify!($store), ") -> Result<(), idemstore::Error> {")]
            /// let key = Key::new("user-7", "checkout", "k1")?;
            /// if let Reservation::Acquired(lease) = store.reserve(&key, Fingerprint::of(b"cart")).await? {
            ///     let resume_after = lease.progress().map_or(0, |p| p.step);
            ///     if resume_after < 1 {
            ///         store.record_step(&lease, 1, b"charge ch_42").await?; // step 1: card charged
            ///     }
            ///     store.complete(&lease, b"order 1".to_vec()).await?;
            /// }
            /// # Ok(()) }
            /// ```
            ///
            /// # Durability
            #[doc = concat!("Answered `Ok` only after ", $durable, ".")]
            ///
            /// # Errors
            /// [`Error::ResultTooLarge`](crate::Error::ResultTooLarge) when `data` is over the
            /// result limit; [`Error::LeaseLost`](crate::Error::LeaseLost) when the lease no
            #[doc = concat!("longer owns the key; [`Error::", $failure, "`](crate::Error::", $failure, ").")]
            pub async fn record_step(
                &self,
                lease: &$crate::Lease,
                step: u32,
                data: &[u8],
            ) -> Result<(), $crate::Error> {
                $crate::remote::record_step(self.inner(), lease, step, data).await
            }

            /// Deletes the reservation if this lease still holds it pending; see
            /// [`Store::release_if_pending`](crate::Store::release_if_pending).
            ///
            /// # Errors
            #[doc = concat!("[`Error::LeaseLost`](crate::Error::LeaseLost), [`Error::", $failure, "`](crate::Error::", $failure, ").")]
            pub async fn release_if_pending(
                &self,
                lease: &$crate::Lease,
            ) -> Result<bool, $crate::Error> {
                $crate::remote::release_if_pending(self.inner(), lease).await
            }

            /// Renews the lease; see [`Store::extend`](crate::Store::extend).
            ///
            /// # Errors
            #[doc = concat!("[`Error::LeaseLost`](crate::Error::LeaseLost), [`Error::", $failure, "`](crate::Error::", $failure, ").")]
            pub async fn extend(
                &self,
                lease: &$crate::Lease,
            ) -> Result<$crate::Lease, $crate::Error> {
                $crate::remote::extend(self.inner(), lease).await
            }

            /// Parks the key for a person; see
            /// [`Store::mark_needs_review`](crate::Store::mark_needs_review).
            ///
            /// # Errors
            /// [`Error::NoteTooLarge`](crate::Error::NoteTooLarge),
            #[doc = concat!("[`Error::LeaseLost`](crate::Error::LeaseLost), [`Error::", $failure, "`](crate::Error::", $failure, ").")]
            pub async fn mark_needs_review(
                &self,
                lease: &$crate::Lease,
                note: &str,
            ) -> Result<(), $crate::Error> {
                $crate::remote::mark_needs_review(self.inner(), lease, note).await
            }

            /// Settles a key under review or a stale reservation; see
            /// [`Store::resolve`](crate::Store::resolve).
            ///
            /// # Errors
            /// [`Error::NotResolvable`](crate::Error::NotResolvable),
            #[doc = concat!("[`Error::ResultTooLarge`](crate::Error::ResultTooLarge), [`Error::", $failure, "`](crate::Error::", $failure, ").")]
            pub async fn resolve(
                &self,
                key: &$crate::Key,
                resolution: $crate::Resolution,
            ) -> Result<(), $crate::Error> {
                $crate::remote::resolve(self.inner(), key, resolution, None).await
            }

            /// [`resolve`](Self::resolve); a [`Resolution::Complete`](crate::Resolution::Complete)
            /// result is kept for `retention` instead of the key's operation's retention; see
            /// [`Store::resolve_with_retention`](crate::Store::resolve_with_retention).
            ///
            /// # Errors
            /// As for [`resolve`](Self::resolve).
            pub async fn resolve_with_retention(
                &self,
                key: &$crate::Key,
                resolution: $crate::Resolution,
                retention: std::time::Duration,
            ) -> Result<(), $crate::Error> {
                $crate::remote::resolve(self.inner(), key, resolution, Some(retention)).await
            }

            /// Deletes whatever is stored for `key`, now; see
            /// [`Store::expire`](crate::Store::expire). The deletion applies only if the
            /// record is unchanged since it was read (else the decision is made again on what
            /// changed). A record past its expiry that no sweep deleted yet is deleted too (a
            /// data-deletion request removes the bytes). The next reserve acquires the key
            /// afresh with a higher token.
            ///
            /// # Durability
            #[doc = concat!("Answered only after ", $durable, ".")]
            ///
            /// # Errors
            /// [`Error::LeaseLive`](crate::Error::LeaseLive) naming the lease's end when a
            /// live lease holds the key (nothing is changed);
            /// [`StorageError::Corruption`](crate::StorageError::Corruption) for a damaged record;
            #[doc = concat!("[`Error::", $failure, "`](crate::Error::", $failure, ") when no definite answer came within the operation deadline.")]
            pub async fn expire(
                &self,
                key: &$crate::Key,
            ) -> Result<Option<$crate::RecordClass>, $crate::Error> {
                self.expire_with(key, $crate::LiveLease::Refuse).await
            }

            /// [`expire`](Self::expire), also when a live lease holds the key; see
            /// [`Store::expire_forced`](crate::Store::expire_forced). The holder is fenced:
            /// its later complete, extend and review fail with
            /// [`Error::LeaseLost`](crate::Error::LeaseLost) and change nothing, and the next
            /// acquisition's token is higher than the holder's.
            ///
            /// # Errors
            /// As for [`expire`](Self::expire), without
            /// [`Error::LeaseLive`](crate::Error::LeaseLive).
            pub async fn expire_forced(
                &self,
                key: &$crate::Key,
            ) -> Result<Option<$crate::RecordClass>, $crate::Error> {
                self.expire_with(key, $crate::LiveLease::Take).await
            }

            /// [`expire`](Self::expire) or [`expire_forced`](Self::expire_forced), as `live`
            /// says.
            ///
            /// # Errors
            /// As for [`expire`](Self::expire).
            pub async fn expire_with(
                &self,
                key: &$crate::Key,
                live: $crate::LiveLease,
            ) -> Result<Option<$crate::RecordClass>, $crate::Error> {
                $crate::remote::expire(self.inner(), key, live).await
            }

            /// The dedup window for queue consumers; see
            /// [`Store::observe`](crate::Store::observe): records `key` as seen for `window`
            /// if nothing is stored for it, and says whether it was new. Every instance
            /// sharing the store sees the same window, so a message redelivered to another
            /// consumer host within it is a [`Seen::Duplicate`](crate::Seen::Duplicate).
            ///
            /// ```no_run
            /// use std::time::Duration;
            #[doc = concat!("use idemstore::{", stringify!($store), ", Key, Seen};")]
            ///
            #[doc = concat!("# async fn run(store: ", stringify!($store), ") -> Result<(), idemstore::Error> {")]
            /// let event = Key::new("orders-queue", "consume", "msg-81f2")?;
            /// if store.observe(&event, Duration::from_secs(5 * 60)).await? == Seen::New {
            ///     // handle the message
            /// }
            /// # Ok(()) }
            /// ```
            ///
            /// # Durability
            #[doc = concat!("`New` is answered only after ", $durable, ".")]
            ///
            /// # Errors
            /// [`StorageError::Corruption`](crate::StorageError::Corruption) for a damaged record;
            #[doc = concat!("[`Error::", $failure, "`](crate::Error::", $failure, ").")]
            pub async fn observe(
                &self,
                key: &$crate::Key,
                window: std::time::Duration,
            ) -> Result<$crate::Seen, $crate::Error> {
                $crate::remote::observe(self.inner(), key, window).await
            }

            #[doc = concat!("[`observe`](Self::observe) for a polled batch of messages, in few ", $batch, ";")]
            /// see [`Store::observe_many`](crate::Store::observe_many).
            ///
            /// # Errors
            #[doc = concat!("The outer error fails the whole batch ([`Error::", $failure, "`](crate::Error::", $failure, "));")]
            /// an item fails alone when its record is damaged.
            pub async fn observe_many(
                &self,
                keys: &[$crate::Key],
                window: std::time::Duration,
            ) -> Result<Vec<Result<$crate::Seen, $crate::Error>>, $crate::Error> {
                $crate::remote::observe_many(self.inner(), keys, window).await
            }

            #[doc = concat!("Completes many leases in few ", $batch, "; see")]
            /// [`Store::complete_many`](crate::Store::complete_many). Returns one result per
            /// item, in order.
            ///
            /// # Durability
            #[doc = concat!("Every item answered `Ok` is answered only after ", $durable, ".")]
            ///
            /// # Errors
            #[doc = concat!("The outer error fails the whole batch ([`Error::", $failure, "`](crate::Error::", $failure, "));")]
            /// an item fails alone with [`Error::ResultTooLarge`](crate::Error::ResultTooLarge)
            /// or [`Error::LeaseLost`](crate::Error::LeaseLost).
            pub async fn complete_many(
                &self,
                items: Vec<(&$crate::Lease, Vec<u8>)>,
            ) -> Result<Vec<Result<(), $crate::Error>>, $crate::Error> {
                $crate::remote::complete_many(self.inner(), items).await
            }

            #[doc = concat!("[`release_if_pending`](Self::release_if_pending) for many leases in few ", $batch, ";")]
            /// see [`Store::release_if_pending_many`](crate::Store::release_if_pending_many).
            ///
            /// # Errors
            /// The outer error fails the whole batch; an item fails alone with
            /// [`Error::LeaseLost`](crate::Error::LeaseLost).
            pub async fn release_if_pending_many(
                &self,
                leases: &[&$crate::Lease],
            ) -> Result<Vec<Result<bool, $crate::Error>>, $crate::Error> {
                $crate::remote::release_if_pending_many(self.inner(), leases).await
            }

            #[doc = concat!("[`extend`](Self::extend) for many leases in few ", $batch, " (one heartbeat")]
            /// for a worker that holds many); see
            /// [`Store::extend_many`](crate::Store::extend_many).
            ///
            /// # Errors
            /// The outer error fails the whole batch; an item fails alone with
            /// [`Error::LeaseLost`](crate::Error::LeaseLost).
            pub async fn extend_many(
                &self,
                leases: &[&$crate::Lease],
            ) -> Result<Vec<Result<$crate::Lease, $crate::Error>>, $crate::Error> {
                $crate::remote::extend_many(self.inner(), leases).await
            }

            #[doc = concat!("Expires many keys in few ", $batch, "; see")]
            /// [`Store::expire_many`](crate::Store::expire_many). A key refused for its live
            /// lease ([`LiveLease::Refuse`](crate::LiveLease::Refuse)) or with a damaged
            /// record fails alone.
            ///
            /// # Durability
            #[doc = concat!("Every key answered `Ok` is deleted once ", $durable, ".")]
            ///
            /// # Errors
            #[doc = concat!("The outer error fails the whole batch ([`Error::", $failure, "`](crate::Error::", $failure, ")).")]
            pub async fn expire_many(
                &self,
                keys: &[$crate::Key],
                live: $crate::LiveLease,
            ) -> Result<Vec<Result<Option<$crate::RecordClass>, $crate::Error>>, $crate::Error>
            {
                $crate::remote::expire_many(self.inner(), keys, live).await
            }

            /// The stored record, `None` when absent or expired; a read of what is
            /// committed.
            ///
            /// # Errors
            /// [`StorageError::Corruption`](crate::StorageError::Corruption),
            #[doc = concat!("[`Error::", $failure, "`](crate::Error::", $failure, ").")]
            pub async fn get(
                &self,
                key: &$crate::Key,
            ) -> Result<Option<$crate::Record>, $crate::Error> {
                $crate::remote::get(self.inner(), key).await
            }
        }

        $crate::reservations::forward_reservations!(
            /// A cluster store, through the same trait as the local one: code written against
            /// [`Reservations`](crate::Reservations) runs on any backend.
            $store {
                reserve: async reserve,
                reserve_many: async reserve_many,
                complete: async complete,
                release_if_pending: async release_if_pending,
                extend: async extend,
                mark_needs_review: async mark_needs_review,
                resolve: async resolve,
                get: async get,
                stale: async stale,
                sweep: async sweep,
                expire: async expire_with,
                record_step: async record_step,
                observe: async observe,
                observe_many: async observe_many,
                reserve_or_wait: async reserve_or_wait,
                complete_many: async complete_many,
                release_if_pending_many: async release_if_pending_many,
                extend_many: async extend_many,
                expire_many: async expire_many,
                complete_with_retention: async complete_with_retention,
                resolve_with_retention: async resolve_with_retention,
            }
        );
    };
}
pub(crate) use store_operations;
