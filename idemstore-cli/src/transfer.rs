//! `init`, `export` and `import`: creating a store, and moving its records out and back in as
//! JSON lines.
//!
//! One record a line, one JSON object, its fields in name order:
//!
//! - `scope`, `operation`, `id`: the key's parts in the printed form (`keys.rs`: `%`, `/`,
//!   whitespace, control characters and non-UTF-8 bytes as `%XX`);
//! - `state`: the stored state, `pending`, `completed` or `needs-review` (a stale reservation
//!   is `pending`: staleness is a matter of time and of the process that holds the store);
//! - `token`, `attempt`: the fencing token and the attempt count;
//! - `fingerprint`: the request's 32-byte fingerprint in hex;
//! - `expires_at_ms`: when the record expires, in milliseconds since the Unix epoch (`null`
//!   for a key under review, which never expires);
//! - with `pending`: `lease_until_ms`, and `progress` `{"step", "data" or "data_hex"}` when a
//!   recovery point was recorded;
//! - with `completed`: `completed_at_ms`, and the result as `result` (UTF-8 text) or
//!   `result_hex`;
//! - with `needs-review`: `marked_at_ms` and `note`.
//!
//! Bytes are text when they are UTF-8 and hex otherwise, so every line reads back as the
//! same record, and exporting what was imported gives the same lines.

use std::collections::BTreeSet;
use std::time::UNIX_EPOCH;

use idemstore::{Builder, Fingerprint, Progress};
use serde_json::Map;

use super::*;
use crate::keys;

/// `idemstore init`: a new, empty store, closed cleanly.
pub(crate) fn init(
    path: &Path,
    retention: Duration,
    mode: u32,
    out: &mut impl Write,
    json: bool,
) -> Result<()> {
    if std::fs::symlink_metadata(path).is_ok() {
        bail!(
            "{} already exists: init creates a new store only",
            path.display()
        );
    }
    let mut builder = Store::builder();
    builder
        .retention(retention)
        .file_mode(mode)
        .sweep_interval(None)
        .preallocate_log(false)
        .admin_socket(idemstore::AdminSocket::Off);
    drop(builder.open(path)?);
    if json {
        let value = json!({ "path": path, "created": true, "retention_ms": millis(retention) });
        writeln!(out, "{value:#}")?;
    } else {
        writeln!(
            out,
            "{}: created, empty (default retention {})",
            path.display(),
            humantime::format_duration(retention)
        )?;
    }
    Ok(())
}

/// `idemstore export`: every record that has not expired, one JSON line each, in key order.
pub(crate) fn export(store: &dyn View, prefix: Option<&str>, out: &mut impl Write) -> Result<()> {
    for (key, record) in scan_prefixed(store, &ScanFilter::any(), prefix, usize::MAX)? {
        if store.class_of(&record) == RecordClass::Expired {
            continue;
        }
        writeln!(out, "{}", Value::Object(line_of(&key, &record)?))?;
    }
    Ok(())
}

fn ms(time: SystemTime) -> u64 {
    millis(time.duration_since(UNIX_EPOCH).unwrap_or_default())
}

/// The export line of one record.
fn line_of(key: &Key, record: &Record) -> Result<Map<String, Value>> {
    let mut line = Map::new();
    line.insert("scope".into(), part(key.scope()).into());
    line.insert("operation".into(), part(key.operation()).into());
    line.insert("id".into(), part(key.id()).into());
    line.insert("token".into(), record.token().into());
    line.insert("attempt".into(), record.attempt().into());
    line.insert(
        "fingerprint".into(),
        hex(record.fingerprint().as_bytes()).into(),
    );
    line.insert("expires_at_ms".into(), record.expires_at().map(ms).into());
    let state = match record.status() {
        Status::Pending {
            lease_until,
            progress,
        } => {
            line.insert("lease_until_ms".into(), ms(lease_until).into());
            if let Some(progress) = progress {
                let mut fields = Map::new();
                fields.insert("step".into(), progress.step.into());
                fields.extend(bytes_json("data", &progress.data));
                line.insert("progress".into(), Value::Object(fields));
            }
            "pending"
        }
        Status::Completed {
            result,
            completed_at,
        } => {
            line.insert("completed_at_ms".into(), ms(completed_at).into());
            line.extend(bytes_json("result", result));
            "completed"
        }
        Status::NeedsReview { note, since } => {
            line.insert("marked_at_ms".into(), ms(since).into());
            line.insert("note".into(), note.into());
            "needs-review"
        }
        _ => bail!(
            "key {} is in a state this build of the tool cannot export",
            show(key)
        ),
    };
    line.insert("state".into(), state.into());
    Ok(line)
}

/// `idemstore import`: reads every line first (a malformed one is refused, naming its
/// number, before anything is written), then writes them in one commit.
pub(crate) fn import(
    path: &Path,
    input: Option<&Path>,
    out: &mut impl Write,
    json: bool,
) -> Result<()> {
    let (text, source) = match input {
        None => (read_result(Path::new("-"))?, "stdin".to_string()),
        Some(file) => (read_result(file)?, file.display().to_string()),
    };
    let text = String::from_utf8(text).map_err(|e| {
        let line = 1 + e.as_bytes()[..e.utf8_error().valid_up_to()]
            .iter()
            .filter(|b| **b == b'\n')
            .count();
        anyhow::anyhow!("{source}, line {line}: not UTF-8 text (an export is JSON lines)")
    })?;
    let mut records = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let record = record_of(line).with_context(|| format!("{source}, line {}", i + 1))?;
        records.push(record);
    }
    let read = records.len();
    let done = idemstore::import(path, records)?;
    if json {
        let value = json!({
            "path": path,
            "read": read,
            "imported": done.imported,
            "already_stored": done.already_stored,
        });
        writeln!(out, "{value:#}")?;
    } else {
        writeln!(
            out,
            "{}: imported {}; {} already stored (kept)",
            path.display(),
            plural(done.imported, "record"),
            done.already_stored
        )?;
    }
    Ok(())
}

/// The fields a line of each state has, besides the common ones.
const COMMON: [&str; 8] = [
    "scope",
    "operation",
    "id",
    "state",
    "token",
    "attempt",
    "fingerprint",
    "expires_at_ms",
];

/// The key and record of one export line.
fn record_of(line: &str) -> Result<(Key, Record)> {
    let value: Value = serde_json::from_str(line).context("not a JSON object")?;
    let Value::Object(fields) = value else {
        bail!("not a JSON object");
    };
    let text = |name: &str| -> Result<&str> {
        fields
            .get(name)
            .and_then(Value::as_str)
            .with_context(|| format!("field `{name}` must be a string"))
    };
    let number = |name: &str| -> Result<u64> {
        fields
            .get(name)
            .and_then(Value::as_u64)
            .with_context(|| format!("field `{name}` must be a whole number (0 or more)"))
    };
    // Bytes given as `name` (text) or `name_hex`, exactly one of them.
    let bytes = |fields: &Map<String, Value>, name: &str| -> Result<Vec<u8>> {
        let hex_name = format!("{name}_hex");
        match (fields.get(name), fields.get(&hex_name)) {
            (Some(Value::String(text)), None) => Ok(text.as_bytes().to_vec()),
            (None, Some(Value::String(hex))) => {
                unhex(hex).with_context(|| format!("field `{hex_name}`"))
            }
            _ => bail!("give `{name}` (text) or `{hex_name}` (hex), one of them as a string"),
        }
    };
    let time = |name: &str| -> Result<SystemTime> {
        Ok(UNIX_EPOCH + Duration::from_millis(number(name)?))
    };
    let key = keys::parse(text("scope")?, text("operation")?, text("id")?)?;
    let token = number("token")?;
    let attempt = u32::try_from(number("attempt")?).context("field `attempt` is over 2^32 - 1")?;
    let fingerprint: [u8; Fingerprint::LEN] = unhex(text("fingerprint")?)
        .ok()
        .and_then(|bytes| bytes.try_into().ok())
        .context("field `fingerprint` must be 64 hex digits")?;
    let state = text("state")?;
    let expires_at = match (state, fields.get("expires_at_ms")) {
        ("needs-review", Some(Value::Null)) => None,
        ("needs-review", _) => bail!("a key under review never expires: `expires_at_ms` is null"),
        _ => Some(time("expires_at_ms")?),
    };
    let (own, progress, result, note): (&[&str], _, _, _);
    let status = match state {
        "pending" => {
            own = &["lease_until_ms", "progress"];
            progress = match fields.get("progress") {
                None => None,
                Some(Value::Object(p)) => Some(Progress {
                    step: p
                        .get("step")
                        .and_then(Value::as_u64)
                        .and_then(|s| u32::try_from(s).ok())
                        .context("field `progress.step` must be a whole number below 2^32")?,
                    data: bytes(p, "data").context("field `progress`")?,
                }),
                Some(_) => bail!("field `progress` must be an object {{\"step\", \"data\"}}"),
            };
            Status::Pending {
                lease_until: time("lease_until_ms")?,
                progress: progress.as_ref(),
            }
        }
        "completed" => {
            own = &["completed_at_ms", "result", "result_hex"];
            result = bytes(&fields, "result")?;
            if result.len() > Builder::MAX_RESULT_LEN_LIMIT {
                bail!(
                    "the result is {} bytes, over the {}-byte limit of any store",
                    result.len(),
                    Builder::MAX_RESULT_LEN_LIMIT
                );
            }
            Status::Completed {
                result: &result,
                completed_at: time("completed_at_ms")?,
            }
        }
        "needs-review" => {
            own = &["marked_at_ms", "note"];
            note = text("note")?;
            if note.len() > Key::MAX_NOTE_LEN {
                bail!(
                    "the note is {} bytes, over its {}-byte limit",
                    note.len(),
                    Key::MAX_NOTE_LEN
                );
            }
            Status::NeedsReview {
                note,
                since: time("marked_at_ms")?,
            }
        }
        other => bail!("field `state` is {other:?}: pending, completed or needs-review"),
    };
    let known: BTreeSet<&str> = COMMON.iter().chain(own).copied().collect();
    if let Some(unknown) = fields.keys().find(|name| !known.contains(name.as_str())) {
        bail!("field `{unknown}` is not one a {state} record has");
    }
    let fingerprint = Fingerprint::from_bytes(fingerprint);
    let record = Record::new(fingerprint, token, attempt, expires_at, status);
    Ok((key, record))
}

/// Hex digits (either case) as bytes.
fn unhex(text: &str) -> Result<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        bail!("an odd number of hex digits");
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .with_context(|| format!("not hex at character {}", i + 1))
        })
        .collect()
}
