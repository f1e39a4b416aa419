//! Rendering: records as JSON, times, durations, sizes, byte previews and tables.

use super::*;

/// A record for `--json`: key parts, state, numbers, times (RFC 3339, UTC) and, with
/// `with_result`, the stored result (as text when it is UTF-8, else as hex).
pub(crate) fn record_json(
    store: &dyn View,
    key: &Key,
    record: &Record,
    now: SystemTime,
    with_result: bool,
) -> Value {
    let mut value = json!({
        "scope": part(key.scope()),
        "operation": part(key.operation()),
        "id": part(key.id()),
        "state": store.class_of(record).name(),
        "attempt": record.attempt(),
        "token": record.token(),
        "fingerprint": hex(record.fingerprint().as_bytes()),
        "expires_at": record.expires_at().map(rfc3339),
    });
    let fields = value.as_object_mut().expect("an object");
    match record.status() {
        Status::Pending {
            lease_until,
            progress,
        } => {
            fields.insert("lease_until".into(), rfc3339(lease_until).into());
            if let Some(progress) = progress {
                fields.insert("recovery_step".into(), progress.step.into());
                fields.insert(
                    "recovery_data".into(),
                    String::from_utf8_lossy(&progress.data).into_owned().into(),
                );
            }
            match now.duration_since(lease_until) {
                Ok(stale_for) => fields.insert("stale_for_ms".into(), millis(stale_for).into()),
                Err(left) => fields.insert("lease_left_ms".into(), millis(left.duration()).into()),
            };
        }
        Status::Completed {
            result,
            completed_at,
        } => {
            fields.insert("completed_at".into(), rfc3339(completed_at).into());
            fields.insert("result_len".into(), result.len().into());
            if with_result {
                fields.extend(bytes_json("result", result));
                if let Some(response) = response_json(result) {
                    fields.insert("response".into(), response);
                }
            }
        }
        Status::NeedsReview { note, since } => {
            fields.insert("marked_at".into(), rfc3339(since).into());
            fields.insert("note".into(), note.into());
        }
        _ => {}
    }
    value
}

/// Bytes as one JSON field: `name` holding the text when they are UTF-8, else `name_hex`
/// holding them in hex.
pub(crate) fn bytes_json(name: &str, bytes: &[u8]) -> serde_json::Map<String, Value> {
    let mut field = serde_json::Map::new();
    match std::str::from_utf8(bytes) {
        Ok(text) => field.insert(name.into(), text.into()),
        Err(_) => field.insert(format!("{name}_hex"), hex(bytes).into()),
    };
    field
}

/// A stored result read as the HTTP (or gRPC) layer's: a response with its status, headers
/// and body, or the marker of a response that was sent but not stored. `None` for any other
/// result.
pub(crate) enum Response {
    Stored(StoredResponse),
    NotStored(u16),
}

impl Response {
    pub(crate) fn of(result: &[u8]) -> Option<Response> {
        match StoredResponse::not_stored_status(result) {
            Some(status) => Some(Response::NotStored(status)),
            None => StoredResponse::decode(result).map(Response::Stored),
        }
    }
}

/// The `response` field of `get --json`: `{"status", "headers": [{"name", "value" or
/// "value_hex"}], "body" or "body_hex"}`, or `{"status", "stored": false}` for a response that
/// was sent but not stored.
fn response_json(result: &[u8]) -> Option<Value> {
    Some(match Response::of(result)? {
        Response::NotStored(status) => json!({ "status": status, "stored": false }),
        Response::Stored(response) => {
            let headers: Vec<Value> = response
                .headers
                .iter()
                .map(|(name, value)| {
                    let mut header = serde_json::Map::new();
                    header.insert("name".into(), name.as_str().into());
                    header.extend(bytes_json("value", value));
                    Value::Object(header)
                })
                .collect();
            let mut fields = serde_json::Map::new();
            fields.insert("status".into(), response.status.into());
            fields.insert("stored".into(), true.into());
            fields.insert("headers".into(), headers.into());
            fields.extend(bytes_json("body", &response.body));
            Value::Object(fields)
        }
    })
}

/// How a record stands in time, for humans: "lease ends in 40s", "stale for 4m12s", ...
pub(crate) fn when(store: &dyn View, record: &Record, now: SystemTime) -> String {
    let class = store.class_of(record);
    match (class, record.status()) {
        (RecordClass::Expired, _) => match record.expires_at() {
            Some(t) => format!("expired {} ago", short(since(now, t))),
            None => "expired".into(),
        },
        // Reserved by an earlier owner of the file: its lease ended with that process.
        (RecordClass::Stale, Status::Pending { lease_until, .. }) if lease_until > now => {
            format!(
                "stale: its process is gone (lease time left {})",
                short(since(lease_until, now))
            )
        }
        (RecordClass::Stale, Status::Pending { lease_until, .. }) => {
            format!("stale for {}", short(since(now, lease_until)))
        }
        (_, Status::Pending { lease_until, .. }) => {
            format!("lease ends in {}", short(since(lease_until, now)))
        }
        (_, Status::Completed { completed_at, .. }) => {
            format!("completed {} ago", short(since(now, completed_at)))
        }
        (_, Status::NeedsReview { since: marked, .. }) => {
            format!("marked {} ago", short(since(now, marked)))
        }
        _ => class.to_string(),
    }
}

/// `later - earlier`, or zero.
pub(crate) fn since(later: SystemTime, earlier: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or_default()
}

/// A time with its distance from now: `2026-11-29T12:00:00Z (3m12s ago)`.
pub(crate) fn at(time: SystemTime, now: SystemTime) -> String {
    let distance = match now.duration_since(time) {
        Ok(ago) => format!("{} ago", short(ago)),
        Err(ahead) => format!("in {}", short(ahead.duration())),
    };
    format!("{} ({distance})", humantime::format_rfc3339_seconds(time))
}

pub(crate) fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A duration in its two largest units: `350ms`, `42s`, `4m12s`, `2h05m`, `3d04h`.
pub(crate) fn short(duration: Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        0 => format!("{}ms", duration.as_millis()),
        1..60 => format!("{secs}s"),
        60..3_600 => format!("{}m{:02}s", secs / 60, secs % 60),
        3_600..86_400 => format!("{}h{:02}m", secs / 3_600, secs / 60 % 60),
        _ => format!("{}d{:02}h", secs / 86_400, secs / 3_600 % 24),
    }
}

/// A byte count for humans: `512 B`, `64.0 KiB`, `1.5 MiB`.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Stored bytes for a one-line preview: text with control characters escaped, cut at `max`
/// characters.
pub(crate) fn preview(bytes: &[u8], max: usize) -> String {
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text
            .chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect::<String>(),
        Err(_) => bytes.escape_ascii().to_string(),
    };
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// `1 slice`, `2 slices`.
pub(crate) fn plural(n: u64, noun: &str) -> String {
    match n {
        1 => format!("1 {noun}"),
        _ => format!("{n} {noun}s"),
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

pub(crate) fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

/// Prints aligned columns (headers first, when given); the last column is not padded.
pub(crate) fn table(
    out: &mut impl Write,
    headers: &[&str],
    rows: &[Vec<String>],
) -> io::Result<()> {
    let columns = rows
        .iter()
        .map(Vec::len)
        .chain([headers.len()])
        .max()
        .unwrap_or(0);
    let mut widths = vec![0; columns];
    let header_row: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for cells in std::iter::once(&header_row).chain(rows.iter()) {
        for (i, cell) in cells.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let print = |out: &mut dyn Write, cells: &[String]| -> io::Result<()> {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                line.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad + 2));
            }
        }
        writeln!(out, "{}", line.trim_end())
    };
    if !headers.is_empty() {
        print(out, &header_row)?;
    }
    for cells in rows.iter() {
        print(out, cells)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_show_their_two_largest_units() {
        let cases = [
            (Duration::from_millis(350), "350ms"),
            (Duration::from_secs(42), "42s"),
            (Duration::from_secs(4 * 60 + 12), "4m12s"),
            (Duration::from_secs(2 * 3600 + 5 * 60 + 59), "2h05m"),
            (Duration::from_secs(3 * 86_400 + 4 * 3600), "3d04h"),
        ];
        for (duration, text) in cases {
            assert_eq!(short(duration), text);
        }
    }

    #[test]
    fn sizes_previews_and_parts_are_readable() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(64 * 1024), "64.0 KiB");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
        assert_eq!(preview(b"201 {\"a\":1}\n", 100), "201 {\"a\":1}\\n");
        assert_eq!(preview("ありがとう".as_bytes(), 3), "ありが…");
        assert_eq!(preview(b"\xff\x00ok", 10), "\\xff\\x00ok");
        assert_eq!(plural(1, "slice"), "1 slice");
        assert_eq!(plural(0, "slice"), "0 slices");
    }
}
