//! The one write path: read the keys' rows (or guess them absent), [`decide`], write with a
//! compare on each row's nonce in one multi-row statement per kind of change, and decide again
//! the keys whose row changed meanwhile. Errors after which a statement may have been applied
//! (a connection reset, a server killed) are settled by reading the row again and looking for
//! the write's own nonce, never by guessing.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio_postgres::types::ToSql;

use super::statement::{refused, sql_millis, stored_body, token_param, Failure, Row, PLACEHOLDER};
use super::store::Inner;
use crate::clock::to_millis;
use crate::decide::{decide, Change, Operation};
use crate::error::Error;
use crate::key::Key;
use crate::record::{Millis, Record};
use crate::remote::Backend;

/// One item's write, waiting for its statement's answer.
struct Sending<T> {
    /// The item's place in key order ([`Work::order`]).
    rank: usize,
    outcome: T,
    /// Put: the record written.
    record: Option<Record>,
}

/// An earlier write of an item whose answer was lost: it landed if the row shows its nonce
/// (a put) or is gone (a delete).
struct Unsettled<T> {
    outcome: T,
    nonce: i64,
    delete: bool,
}

/// What one call of [`Inner::rounds`] knows, by an item's place in key order (its rank).
struct Work<T> {
    /// The items in key order, a key's occurrences in item order: every statement locks rows
    /// in this one order, and the occurrences of a key are neighbours.
    order: Vec<usize>,
    /// For each rank, the rank of its key's first occurrence: the key's slot in `known`.
    run: Vec<usize>,
    /// By item.
    results: Vec<Option<Result<T, Error>>>,
    /// By a key's first rank: its row (None: absent) and whether it is only a guess.
    known: Vec<Option<(Option<Row>, bool)>>,
    /// By rank.
    unsettled: HashMap<usize, Vec<Unsettled<T>>>,
    /// Ranks to decide again.
    again: Vec<usize>,
    failed: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl<T> Work<T> {
    /// Answers the item of rank `rank`.
    fn answer(&mut self, rank: usize, outcome: Result<T, Error>) {
        self.results[self.order[rank]] = Some(outcome);
        if !self.unsettled.is_empty() {
            self.unsettled.remove(&rank);
        }
    }

    /// Whether an occurrence of the key of rank `rank` comes after it (a round decides the
    /// first occurrence still to do, so the rest come after it).
    fn more_of(&self, rank: usize) -> bool {
        self.run.get(rank + 1) == Some(&self.run[rank])
    }
}

/// How a call of [`Inner::rounds`] begins.
enum Start<T> {
    /// Each row guessed (a hint, or absent when the caller allows), read only when needed.
    Guess,
    /// The single-key path's write did not apply (the row changed, or the key exists) or
    /// failed (`failure`, counted against the operation deadline): read the row first,
    /// settling the write by its nonce when its answer was lost.
    Read {
        unsettled: Option<Unsettled<T>>,
        failure: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl Backend for Inner {
    fn now(&self) -> Millis {
        to_millis(self.clock.now())
    }

    fn max_result_len(&self) -> usize {
        self.max_result_len
    }

    async fn read_record(&self, key: &Key) -> Result<Option<Record>, Error> {
        match self
            .read_rows(&[key.encoded()])
            .await?
            .remove(key.encoded())
        {
            None => Ok(None),
            Some(row) => Ok(Some(row?.record)),
        }
    }

    /// Applies `op` to one key, as [`decide_write_many`](Backend::decide_write_many) does, with a shorter path
    /// for the common case: the row guessed (this process's own pending row, or absent when
    /// `absent_first`), the decision written in one statement, and the answer given when it
    /// applied. Anything else (the row changed, the key exists, a failure, a decision that
    /// changes nothing or deletes) goes the general way, reading the row.
    async fn decide_write<O>(
        &self,
        key: &Key,
        op: O,
        absent_first: bool,
    ) -> Result<O::Outcome, Error>
    where
        O: Operation + Clone + Sync,
    {
        let started = Instant::now();
        let hint = self.hints.lock().remove(key.encoded());
        let general = |op, start| async move {
            let ops = [(key, op)];
            let mut outcomes = self.rounds(&ops, absent_first, started, start).await?;
            outcomes.pop().expect("one outcome per item")
        };
        if hint.is_none() && !absent_first {
            return general(op, Start::Guess).await;
        }
        let old = hint.as_ref().map(|row| row.nonce);
        let decision = decide(
            hint.as_ref().map(|row| row.record.clone()),
            op.clone(),
            self.now(),
            self.policies.for_key(key),
            PLACEHOLDER,
        );
        let Change::Put(mut record) = decision.change else {
            // Keep (which a guess cannot answer) or delete: the general way, with the hint.
            if let Some(row) = hint {
                self.hints.lock().note_owned(key.encoded(), row);
            }
            return general(op, Start::Guess).await;
        };
        let nonce = self.nonce();
        let (expires, lease) = (
            sql_millis(record.expires_at),
            record.lease_until().map(sql_millis),
        );
        let body = stored_body(&record);
        let k = key.encoded();
        let answer = match old {
            Some(old) => {
                let (fresh, token) = token_param(&record);
                self.query(
                    &self.sql.update_one,
                    &[&k, &old, &fresh, &token, &nonce, &expires, &lease, &body],
                )
                .await
            }
            None if record.token == PLACEHOLDER => {
                self.query(
                    &self.sql.insert_fresh_one,
                    &[&k, &nonce, &expires, &lease, &body],
                )
                .await
            }
            None => {
                let (fresh, token) = token_param(&record);
                self.query(
                    &self.sql.insert_one,
                    &[&k, &fresh, &token, &nonce, &expires, &lease, &body],
                )
                .await
            }
        };
        let failure = match answer {
            Ok(rows) => {
                let Some(row) = rows.first().filter(|row| row.get::<_, i64>(0) == nonce) else {
                    // The row changed, or the key exists: read it and decide again.
                    return general(
                        op,
                        Start::Read {
                            unsettled: None,
                            failure: None,
                        },
                    )
                    .await;
                };
                let token = row.get::<_, i64>(1).cast_unsigned();
                if row.len() > 2 && row.get::<_, bool>(2) {
                    self.wake(&[k]).await;
                }
                record.token = token;
                self.hints.lock().note_owned(k, Row { record, nonce });
                return Ok(O::outcome_with_token(decision.outcome, token));
            }
            Err(Failure::Refused(error)) => {
                return Err(refused(&[(key, ())], 1, error));
            }
            Err(Failure::Retry(error)) => Start::Read {
                unsettled: None,
                failure: Some(error),
            },
            Err(Failure::Unknown(error)) => Start::Read {
                unsettled: Some(Unsettled {
                    outcome: decision.outcome,
                    nonce,
                    delete: false,
                }),
                failure: Some(error),
            },
        };
        self.resends.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(10)).await;
        general(op, failure).await
    }

    /// Applies each `(key, op)` through [`decide`], in few statements: the rows are read in one
    /// (or, when `absent_first`, guessed absent: most keys reserved or observed are new, and a
    /// wrong guess only costs an insert that finds the key), each key is decided, and the
    /// changes are written in at most one insert, one update and one delete statement, each
    /// row under a compare on the nonce it was decided on. Keys whose row changed meanwhile
    /// are read and decided again; a key named twice is decided again after its first
    /// occurrence was written, so the second sees the first. A decision that changes nothing
    /// is answered only from a row read from PostgreSQL, never from a guess.
    ///
    /// # Errors
    /// The outer error when PostgreSQL refused a statement, or gave no answer within the
    /// operation deadline (saying whether a write may have been applied); an item's error
    /// (a damaged row) fails that item alone.
    async fn decide_write_many<O>(
        &self,
        ops: &[(Key, O)],
        absent_first: bool,
    ) -> Result<Vec<Result<O::Outcome, Error>>, Error>
    where
        O: Operation + Clone + Sync,
    {
        self.rounds(ops, absent_first, Instant::now(), Start::Guess)
            .await
    }
}

impl Inner {
    /// [`decide_write_many`](Backend::decide_write_many) from `start`, with the operation deadline counted
    /// from `started`.
    async fn rounds<K: Borrow<Key>, O>(
        &self,
        ops: &[(K, O)],
        absent_first: bool,
        started: Instant,
        start: Start<O::Outcome>,
    ) -> Result<Vec<Result<O::Outcome, Error>>, Error>
    where
        O: Operation + Clone,
    {
        let n = ops.len();
        let key = |item: usize| ops[item].0.borrow().encoded();
        let mut order: Vec<usize> = (0..n).collect();
        // Stable: a key's occurrences stay in item order.
        order.sort_by(|&a, &b| key(a).cmp(key(b)));
        let mut run: Vec<usize> = Vec::with_capacity(n);
        for rank in 0..n {
            let first = if rank > 0 && key(order[rank]) == key(order[rank - 1]) {
                run[rank - 1]
            } else {
                rank
            };
            run.push(first);
        }
        let mut w = Work {
            order,
            run,
            results: (0..n).map(|_| None).collect(),
            known: (0..n).map(|_| None).collect(),
            unsettled: HashMap::new(),
            again: Vec::new(),
            failed: None,
        };
        let mut pause = Duration::from_millis(10);
        let mut todo: Vec<usize> = (0..n).collect();
        let mut last_failure: Option<Box<dyn std::error::Error + Send + Sync>> = None;
        let mut first_round = true;
        if let Start::Read { unsettled, failure } = start {
            first_round = false;
            if failure.is_some() {
                last_failure = failure;
                pause = Duration::from_millis(20);
            }
            if let Some(unsettled) = unsettled {
                w.unsettled.insert(0, vec![unsettled]);
            }
        }
        while !todo.is_empty() {
            if last_failure.is_some() && started.elapsed() + pause > self.op_deadline {
                let landed = if w.unsettled.is_empty() {
                    "nothing was applied"
                } else {
                    "a write whose answer was lost may or may not have been applied"
                };
                return Err(Error::Database {
                    context: format!(
                        "writing {} of {} keys (first: {}); no answer within {:?}, {landed}",
                        todo.len(),
                        n,
                        ops[w.order[todo[0]]].0.borrow(),
                        self.op_deadline
                    ),
                    source: last_failure.take().expect("checked above"),
                });
            }
            // This round: the first occurrence of each key still to do (todo is in key order).
            let mut round = Vec::with_capacity(todo.len());
            w.again = Vec::new();
            for &rank in &todo {
                if round.last().is_some_and(|&last| w.run[last] == w.run[rank]) {
                    w.again.push(rank);
                } else {
                    round.push(rank);
                }
            }
            // What is not known yet: guessed in the first round, read otherwise.
            let mut to_read = Vec::new();
            {
                let hints = first_round.then(|| self.hints.lock());
                for &rank in &round {
                    let slot = w.run[rank];
                    if w.known[slot].is_some() {
                        continue;
                    }
                    if let Some(hints) = &hints {
                        if let Some(row) = hints.get(key(w.order[rank])) {
                            w.known[slot] = Some((Some(row.clone()), true));
                            continue;
                        }
                        if absent_first {
                            w.known[slot] = Some((None, true));
                            continue;
                        }
                    }
                    to_read.push(rank);
                }
            }
            if !to_read.is_empty() {
                let keys: Vec<&[u8]> = to_read.iter().map(|&rank| key(w.order[rank])).collect();
                let mut rows = self.read_rows(&keys).await?;
                for &rank in &to_read {
                    let slot = w.run[rank];
                    match rows.remove(key(w.order[rank])) {
                        None => w.known[slot] = Some((None, false)),
                        Some(Ok(row)) => w.known[slot] = Some((Some(row), false)),
                        // A round names each key once: that item fails alone.
                        Some(Err(error)) => w.answer(rank, Err(error)),
                    }
                }
            }
            first_round = false;
            let now = self.now();
            let mut inserts: Vec<(Sending<O::Outcome>, i64)> = Vec::new();
            let mut updates: Vec<(Sending<O::Outcome>, i64)> = Vec::new();
            let mut deletes: Vec<(Sending<O::Outcome>, i64)> = Vec::new();
            for rank in round {
                let item = w.order[rank];
                if w.results[item].is_some() {
                    continue;
                }
                let (k, op) = &ops[item];
                let k: &Key = k.borrow();
                let slot = w.run[rank];
                let Some((current, guessed)) = &w.known[slot] else {
                    w.again.push(rank);
                    continue;
                };
                let guessed = *guessed;
                // An earlier write of this item whose answer was lost: did it land?
                if let Some(earlier) = w.unsettled.get_mut(&rank) {
                    let landed = earlier.iter().position(|u| match current {
                        Some(row) => !u.delete && row.nonce == u.nonce,
                        None => u.delete,
                    });
                    if let (Some(at), false) = (landed, guessed) {
                        let found = earlier.swap_remove(at);
                        let token = current.as_ref().map_or(0, |row| row.record.token);
                        w.answer(rank, Ok(O::outcome_with_token(found.outcome, token)));
                        continue;
                    }
                }
                let old = current.as_ref().map(|row| row.nonce);
                let decision = decide(
                    current.as_ref().map(|row| row.record.clone()),
                    op.clone(),
                    now,
                    self.policies.for_key(k),
                    PLACEHOLDER,
                );
                let record = match decision.change {
                    Change::Keep if guessed => {
                        w.known[slot] = None;
                        w.again.push(rank);
                        continue;
                    }
                    Change::Keep => {
                        w.answer(rank, Ok(decision.outcome));
                        continue;
                    }
                    Change::Put(record) => Some(record),
                    Change::Delete => None,
                };
                let sending = Sending {
                    rank,
                    outcome: decision.outcome,
                    record,
                };
                match (&sending.record, old) {
                    (Some(_), None) => inserts.push((sending, 0)),
                    (Some(_), Some(old)) => updates.push((sending, old)),
                    (None, old) => deletes.push((sending, old.unwrap_or(0))),
                }
            }
            w.failed = None;
            if !inserts.is_empty() {
                self.send_puts(ops, &mut w, inserts, false).await?;
            }
            if !updates.is_empty() {
                self.send_puts(ops, &mut w, updates, true).await?;
            }
            if !deletes.is_empty() {
                self.send_deletes(ops, &mut w, deletes).await?;
            }
            if let Some(error) = w.failed.take() {
                last_failure = Some(error);
                self.resends.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            todo = std::mem::take(&mut w.again);
            todo.sort_unstable();
        }
        Ok(w.results
            .into_iter()
            .map(|result| result.expect("every item answered"))
            .collect())
    }

    /// Sends the puts of one round (in key order) as one insert (`update` false: the keys were
    /// absent) or one update (each under a compare on the nonce it was decided on). The rows
    /// get the nonces `first ..` in order, and the statement returns each written row's nonce,
    /// which names its item.
    async fn send_puts<K: Borrow<Key>, O: Operation>(
        &self,
        ops: &[(K, O)],
        w: &mut Work<O::Outcome>,
        puts: Vec<(Sending<O::Outcome>, i64)>,
        update: bool,
    ) -> Result<(), Error> {
        let n = puts.len();
        let first = self.nonces(n);
        let (mut keys, mut olds, mut fresh, mut tokens) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut expires, mut leases, mut bodies) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let mut all_fresh = true;
        for (sending, old) in &puts {
            let record = sending.record.as_ref().expect("a put has a record");
            keys.push(ops[w.order[sending.rank]].0.borrow().encoded());
            olds.push(*old);
            let (is_fresh, token) = token_param(record);
            all_fresh &= is_fresh;
            fresh.push(is_fresh);
            tokens.push(token);
            expires.push(sql_millis(record.expires_at));
            leases.push(record.lease_until().map(sql_millis));
            bodies.push(stored_body(record));
        }
        let sql = &self.sql;
        let answer = match (n, update, all_fresh) {
            (1, true, _) => {
                let params: [&(dyn ToSql + Sync); 8] = [
                    &keys[0],
                    &olds[0],
                    &fresh[0],
                    &tokens[0],
                    &first,
                    &expires[0],
                    &leases[0],
                    &bodies[0],
                ];
                self.query(&sql.update_one, &params).await
            }
            (1, false, true) => {
                let params: [&(dyn ToSql + Sync); 5] =
                    [&keys[0], &first, &expires[0], &leases[0], &bodies[0]];
                self.query(&sql.insert_fresh_one, &params).await
            }
            (1, false, false) => {
                let params: [&(dyn ToSql + Sync); 7] = [
                    &keys[0],
                    &fresh[0],
                    &tokens[0],
                    &first,
                    &expires[0],
                    &leases[0],
                    &bodies[0],
                ];
                self.query(&sql.insert_one, &params).await
            }
            (_, true, _) => {
                let params: [&(dyn ToSql + Sync); 8] = [
                    &keys, &olds, &fresh, &tokens, &first, &expires, &leases, &bodies,
                ];
                self.query(&sql.update, &params).await
            }
            (_, false, true) => {
                let params: [&(dyn ToSql + Sync); 5] = [&keys, &first, &expires, &leases, &bodies];
                self.query(&sql.insert_fresh, &params).await
            }
            (_, false, false) => {
                let params: [&(dyn ToSql + Sync); 7] =
                    [&keys, &fresh, &tokens, &first, &expires, &leases, &bodies];
                self.query(&sql.insert, &params).await
            }
        };
        match answer {
            Ok(rows) => {
                // Each returned row by its nonce's place; an insert makes an unwatched row, an
                // update says whether the row was watched.
                let mut written: Vec<Option<i64>> = vec![None; n];
                let mut watched: Vec<&[u8]> = Vec::new();
                let mut landed = |nonce: i64, token: i64, was_watched: bool| {
                    let at = nonce.wrapping_sub(first) as usize;
                    if let Some(slot) = written.get_mut(at) {
                        *slot = Some(token);
                        if was_watched {
                            watched.push(keys[at]);
                        }
                    }
                };
                if n == 1 {
                    for row in &rows {
                        landed(
                            row.get(0),
                            row.get(1),
                            row.len() > 2 && row.get::<_, bool>(2),
                        );
                    }
                } else if let Some(row) = rows.first() {
                    // The multi-row statements answer with arrays (`schema::AGGREGATE`).
                    let nonces: Vec<i64> = row.get::<_, Option<_>>(0).unwrap_or_default();
                    let tokens: Vec<i64> = row.get::<_, Option<_>>(1).unwrap_or_default();
                    let flags: Vec<bool> = if row.len() > 2 {
                        row.get::<_, Option<_>>(2).unwrap_or_default()
                    } else {
                        Vec::new()
                    };
                    for (i, (&nonce, &token)) in nonces.iter().zip(&tokens).enumerate() {
                        landed(nonce, token, flags.get(i).copied().unwrap_or(false));
                    }
                }
                self.wake(&watched).await;
                // The hints of the whole statement under one lock.
                let mut hints = self.hints.lock();
                for (at, (sending, _)) in puts.into_iter().enumerate() {
                    let rank = sending.rank;
                    let slot = w.run[rank];
                    match written[at] {
                        Some(token) => {
                            let token = token.cast_unsigned();
                            let mut record = sending.record.expect("a put has a record");
                            record.token = token;
                            let row = Row {
                                record,
                                nonce: first + at as i64,
                            };
                            // Kept only for an occurrence of the key still to decide.
                            if w.more_of(rank) {
                                hints.note(keys[at], Some(&row));
                                w.known[slot] = Some((Some(row), false));
                            } else {
                                hints.note_owned(keys[at], row);
                            }
                            w.answer(rank, Ok(O::outcome_with_token(sending.outcome, token)));
                        }
                        None => {
                            // The row changed (or exists) since it was decided on.
                            hints.note(keys[at], None);
                            w.known[slot] = None;
                            w.again.push(rank);
                        }
                    }
                }
                Ok(())
            }
            Err(Failure::Refused(error)) => Err(refused(ops, n, error)),
            Err(Failure::Retry(error)) => {
                w.again.extend(puts.iter().map(|(sending, _)| sending.rank));
                w.failed = Some(error);
                Ok(())
            }
            Err(Failure::Unknown(error)) => {
                let sent = puts
                    .into_iter()
                    .enumerate()
                    .map(|(at, (sending, _))| (sending, first + at as i64));
                self.unsettle(ops, w, sent, false);
                w.failed = Some(error);
                Ok(())
            }
        }
    }

    /// Items whose statement's answer was lost: each may or may not have landed, so its row is
    /// forgotten, the write is kept to be settled by its nonce, and the item goes round again.
    fn unsettle<K: Borrow<Key>, O: Operation>(
        &self,
        ops: &[(K, O)],
        w: &mut Work<O::Outcome>,
        sent: impl Iterator<Item = (Sending<O::Outcome>, i64)>,
        delete: bool,
    ) {
        let mut hints = self.hints.lock();
        for (sending, nonce) in sent {
            let rank = sending.rank;
            hints.remove(ops[w.order[rank]].0.borrow().encoded());
            w.known[w.run[rank]] = None;
            w.unsettled.entry(rank).or_default().push(Unsettled {
                outcome: sending.outcome,
                nonce,
                delete,
            });
            w.again.push(rank);
        }
    }

    /// Sends the deletes of one round (in key order) as one statement, each under a compare on
    /// its nonce.
    async fn send_deletes<K: Borrow<Key>, O: Operation>(
        &self,
        ops: &[(K, O)],
        w: &mut Work<O::Outcome>,
        deletes: Vec<(Sending<O::Outcome>, i64)>,
    ) -> Result<(), Error> {
        let keys: Vec<&[u8]> = deletes
            .iter()
            .map(|(s, _)| ops[w.order[s.rank]].0.borrow().encoded())
            .collect();
        let olds: Vec<i64> = deletes.iter().map(|(_, old)| *old).collect();
        match self.query(&self.sql.delete, &[&keys, &olds]).await {
            Ok(rows) => {
                let gone: std::collections::HashSet<&[u8]> =
                    rows.iter().map(|row| row.get::<_, &[u8]>(0)).collect();
                let watched: Vec<&[u8]> = rows
                    .iter()
                    .filter(|row| row.get::<_, bool>(1))
                    .map(|row| row.get::<_, &[u8]>(0))
                    .collect();
                self.wake(&watched).await;
                let mut hints = self.hints.lock();
                for (at, (sending, _)) in deletes.into_iter().enumerate() {
                    let rank = sending.rank;
                    let slot = w.run[rank];
                    hints.remove(keys[at]);
                    if gone.contains(keys[at]) {
                        w.known[slot] = Some((None, false));
                        w.answer(rank, Ok(sending.outcome));
                    } else {
                        w.known[slot] = None;
                        w.again.push(rank);
                    }
                }
                Ok(())
            }
            Err(Failure::Refused(error)) => Err(refused(ops, deletes.len(), error)),
            Err(Failure::Retry(error)) => {
                w.again
                    .extend(deletes.iter().map(|(sending, _)| sending.rank));
                w.failed = Some(error);
                Ok(())
            }
            Err(Failure::Unknown(error)) => {
                // A delete writes no nonce: it landed if the row is gone.
                let sent = deletes.into_iter().map(|(sending, _)| (sending, 0));
                self.unsettle(ops, w, sent, true);
                w.failed = Some(error);
                Ok(())
            }
        }
    }
}
