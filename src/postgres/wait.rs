//! Waking [`reserve_or_wait`](super::PgStore::reserve_or_wait) callers when the key they wait
//! for changes, with PostgreSQL's `LISTEN`/`NOTIFY` instead of polling.
//!
//! - A waiter whose reserve answered "in progress" marks the key's row as watched (`watched =
//!   true`, a column no index covers, so the holder's writes stay HOT updates and the row's
//!   nonce is unchanged), after registering here for the key.
//! - Every write (completion, release, review mark, takeover, expiry) returns the row's
//!   `watched`; a writer that changed a watched row sends `pg_notify` on the store's channel
//!   (`T_wake`) with the key's encoding in hex, once the write committed. An unwatched row (the
//!   usual case) costs nothing more: `NOTIFY` serializes the commits that send one, so it is
//!   sent only when someone waits.
//! - One connection per store, out of the pool, `LISTEN`s on the channel and wakes the
//!   waiters of the key named. It is opened by the first wait and opened again after it
//!   drops; while it is down, and after it comes back (notifications sent meanwhile are lost),
//!   every waiter asks again, and then at least every
//!   [`wait_poll`](super::PgBuilder::wait_poll).
//!
//! The row lock orders the two writes: a completion either comes before the mark (which then
//! finds no pending row, and the waiter asks again at once) or after it (and sees `watched`).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, NoTls};

/// Waiters by key, and whether a listener runs.
pub(crate) struct Waiters {
    channel: String,
    config: tokio_postgres::Config,
    state: parking_lot::Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Each waited key's wake-up, with how many calls wait on it.
    keys: HashMap<Vec<u8>, (Arc<Notify>, usize)>,
    /// Whether a listener task runs (connecting, listening, or pausing before connecting).
    running: bool,
}

/// One call's registration for a key, removed when dropped.
pub(crate) struct Registration {
    waiters: Arc<Waiters>,
    key: Vec<u8>,
    pub(crate) notify: Arc<Notify>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut state = self.waiters.state.lock();
        if let Some((_, count)) = state.keys.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                state.keys.remove(&self.key);
            }
        }
    }
}

impl Waiters {
    pub(crate) fn new(table: &str, config: tokio_postgres::Config) -> Waiters {
        Waiters {
            channel: channel(table),
            config,
            state: parking_lot::Mutex::new(State::default()),
        }
    }

    /// Registers a call waiting on `key` (encoded), starting the listener if none runs.
    pub(crate) fn register(self: &Arc<Self>, key: &[u8]) -> Registration {
        let mut state = self.state.lock();
        let notify = {
            let entry = state
                .keys
                .entry(key.to_vec())
                .or_insert_with(|| (Arc::new(Notify::new()), 0));
            entry.1 += 1;
            entry.0.clone()
        };
        if !state.running {
            state.running = true;
            tokio::spawn(listen(Arc::downgrade(self)));
        }
        Registration {
            waiters: self.clone(),
            key: key.to_vec(),
            notify,
        }
    }

    fn wake(&self, key: &[u8]) {
        if let Some((notify, _)) = self.state.lock().keys.get(key) {
            notify.notify_waiters();
        }
    }

    fn wake_all(&self) {
        let state = self.state.lock();
        for (notify, _) in state.keys.values() {
            notify.notify_waiters();
        }
    }
}

/// The channel of table `T`: `T_wake` (an identifier: the table name is checked).
pub(crate) fn channel(table: &str) -> String {
    format!("{table}_wake")
}

/// The listener task: connects, `LISTEN`s, wakes waiters by key, and connects again after the
/// connection drops, until the store is gone or nobody waits.
async fn listen(waiters: Weak<Waiters>) {
    loop {
        let Some(strong) = waiters.upgrade() else {
            return;
        };
        let (config, channel) = (strong.config.clone(), strong.channel.clone());
        drop(strong);
        if let Ok((client, mut connection)) = config.connect(NoTls).await {
            // The connection's messages, notifications forwarded, until it closes.
            let (sender, mut payloads) = tokio::sync::mpsc::unbounded_channel::<String>();
            let driver = tokio::spawn(async move {
                while let Some(Ok(message)) =
                    std::future::poll_fn(|cx| connection.poll_message(cx)).await
                {
                    if let AsyncMessage::Notification(note) = message {
                        if sender.send(note.payload().to_string()).is_err() {
                            return;
                        }
                    }
                }
            });
            if client
                .batch_execute(&format!("LISTEN {channel}"))
                .await
                .is_ok()
            {
                // Notifications sent before now are lost: every waiter asks again.
                if let Some(strong) = waiters.upgrade() {
                    strong.wake_all();
                }
                while let Some(payload) = payloads.recv().await {
                    let Some(strong) = waiters.upgrade() else {
                        driver.abort();
                        return;
                    };
                    if let Some(key) = unhex(&payload) {
                        strong.wake(&key);
                    }
                }
            }
            driver.abort();
            drop(client);
        }
        let Some(strong) = waiters.upgrade() else {
            return;
        };
        strong.wake_all();
        {
            let mut state = strong.state.lock();
            if state.keys.is_empty() {
                // Nobody waits: the next waiter starts a listener again.
                state.running = false;
                return;
            }
        }
        drop(strong);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A key's encoding in hex, the notification's payload.
pub(crate) fn hex(key: &[u8]) -> String {
    use std::fmt::Write;
    let mut text = String::with_capacity(key.len() * 2);
    for byte in key {
        let _ = write!(text, "{byte:02x}");
    }
    text
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}
