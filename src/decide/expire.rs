//! `expire(key)`: the fourth operation of the design, beside reserve, complete and
//! release-if-pending. It deletes whatever is stored for the key, now, instead of waiting for
//! the key's retention to end.

use crate::record::{Millis, Record, RecordClass};

use super::{Change, Decision, Operation, Policy};

/// `expire(key)`, refusing a live lease unless `force` is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expire {
    /// Take the key from a holder whose lease is still live. The holder's later complete,
    /// release and extend then answer "lease lost", and its token is never handed out again.
    pub force: bool,
}

/// What an expire answers: the phase the removed record was in (`None` when nothing was
/// stored), or the end of the live lease that refused it.
pub(crate) type Expired = Result<Option<RecordClass>, Millis>;

impl Operation for Expire {
    type Outcome = Expired;

    /// An expired record that a sweep has not deleted yet is deleted too: a data-deletion
    /// request must remove the bytes, not only hide them.
    const SEES_EXPIRED: bool = true;

    fn decide_live(
        self,
        current: Option<Record>,
        now: Millis,
        policy: Policy,
        _next_token: u64,
    ) -> Decision<Expired> {
        let Some(record) = current else {
            return Decision::answer(Ok(None));
        };
        let phase = record.class(now, policy.floor);
        match (phase, record.lease_until()) {
            (RecordClass::Pending, Some(lease_until)) if !self.force => {
                Decision::answer(Err(lease_until))
            }
            _ => Decision::change(Change::Delete, Ok(Some(phase))),
        }
    }
}
