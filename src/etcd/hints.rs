//! What this process last wrote of its pending records, so that the holder's next write
//! (complete, extend, release, a recovery point) goes out at once under a compare on that
//! revision instead of reading the record first: one round trip instead of two. A hint is only
//! a guess: if anyone changed the record since, the compare fails, the transaction's failure
//! branch returns the record as it is, and the operation is decided again on that, so a stale
//! hint costs nothing but the refused compare.

use std::collections::HashMap;

use parking_lot::Mutex;

use super::layout::Stored;
use crate::key::Key;
use crate::record::State;

/// Most hints kept; when full, all are dropped (they are only guesses).
const MAX_HINTS: usize = 16_384;
/// Recovery points larger than this are not kept in memory.
const MAX_HINT_PROGRESS: usize = 1024;

/// The pending records this process wrote last, by key.
#[derive(Debug, Default)]
pub(crate) struct Hints {
    map: Mutex<HashMap<Key, Stored>>,
}

impl Hints {
    /// The record this process last wrote for `key`, if it was pending.
    pub(crate) fn get(&self, key: &Key) -> Option<Stored> {
        self.map.lock().get(key).cloned()
    }

    /// Notes what `key` holds now (as written or as read back): kept if pending, else
    /// forgotten.
    pub(crate) fn note(&self, key: &Key, now: Option<&Stored>) {
        let keep = now.filter(|stored| match &stored.record.state {
            State::Pending { progress, .. } => progress
                .as_ref()
                .is_none_or(|p| p.data.len() <= MAX_HINT_PROGRESS),
            _ => false,
        });
        let mut map = self.map.lock();
        match keep {
            Some(stored) => {
                if map.len() >= MAX_HINTS && !map.contains_key(key) {
                    map.clear();
                }
                map.insert(key.clone(), stored.clone());
            }
            None => {
                map.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::layout::Nonce;
    use crate::fingerprint::Fingerprint;
    use crate::record::Record;

    fn stored(state: State) -> Stored {
        Stored {
            record: Record {
                fingerprint: Fingerprint::of(b"b"),
                token: 1,
                attempt: 1,
                expires_at: 10,
                state,
            },
            nonce: Nonce { store: 0, write: 0 },
            mod_revision: 3,
            create_revision: 3,
        }
    }

    #[test]
    fn only_pending_records_are_kept() {
        let hints = Hints::default();
        let key = Key::new("s", "o", "i").unwrap();
        let pending = stored(State::Pending {
            lease_until: 5,
            progress: None,
        });
        hints.note(&key, Some(&pending));
        assert_eq!(hints.get(&key).map(|s| s.mod_revision), Some(3));
        let completed = stored(State::Completed {
            completed_at: 6,
            result: vec![1],
        });
        hints.note(&key, Some(&completed));
        assert!(hints.get(&key).is_none(), "a completed record is forgotten");
        hints.note(&key, Some(&pending));
        hints.note(&key, None);
        assert!(hints.get(&key).is_none(), "a deleted record is forgotten");
    }
}
