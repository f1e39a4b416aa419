//! Keys as the tool prints them and reads them back: each part percent-escaped, the three
//! parts joined by `/` (`user%2F7/POST%20%2Fcharges/k1`).
//!
//! In a part, `%`, `/`, whitespace, control characters and bytes that are not UTF-8 are
//! written `%XX` (each byte of their UTF-8, uppercase hex); every other character is itself.
//! So a part never holds a `/` or a space, the three parts of a printed key are told apart,
//! and any bytes round-trip. Reading back, `%XX` (either case) is that byte, any other `%` is
//! refused, and every other character is its UTF-8 bytes: a key can be typed as three
//! arguments or as one `SCOPE/OPERATION/ID` argument.

use anyhow::{bail, Context, Result};
use idemstore::Key;

/// A key part in the printed form (the library's, as every message prints keys).
pub(crate) fn part(bytes: &[u8]) -> String {
    Key::printed_part(bytes)
}

/// A key in the printed form: `scope/operation/id`, each part as [`part`] writes it.
pub(crate) fn show(key: &Key) -> String {
    key.to_string()
}

/// A part read back from its printed form; `what` names it in the refusal.
pub(crate) fn parse_part(text: &str, what: &str) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b != b'%' {
            out.push(b);
            rest = tail;
            continue;
        }
        let byte = tail
            .get(..2)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        let Some(byte) = byte else {
            bail!(
                "the {what} {text:?} has a `%` not followed by two hex digits: in a key, \
                 write `%` as %25 (and `/` as %2F, a space as %20)"
            );
        };
        out.push(byte);
        rest = &tail[2..];
    }
    Ok(out)
}

/// A key from its three parts in the printed form.
pub(crate) fn parse(scope: &str, operation: &str, id: &str) -> Result<Key> {
    let scope = parse_part(scope, "scope")?;
    let operation = parse_part(operation, "operation")?;
    let id = parse_part(id, "id")?;
    Key::new(scope, operation, id).context("bad key")
}

/// A key from one `SCOPE/OPERATION/ID` argument, as the tool prints it.
pub(crate) fn parse_joined(text: &str) -> Result<Key> {
    match text.split('/').collect::<Vec<_>>()[..] {
        [scope, operation, id] => parse(scope, operation, id),
        _ => bail!(
            "the key {text:?} is not SCOPE/OPERATION/ID: give three parts joined by two `/` \
             (a `/` inside a part is written %2F), or the three parts as separate arguments"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_parts_read_back_as_the_same_bytes() {
        let parts: [&[u8]; 8] = [
            b"plain-1",
            b"a/b",
            b"100%",
            b"two words",
            b"\xff\x00\xfe",
            "利用者/ü".as_bytes(),
            b"%2F",
            b"tab\there\n",
        ];
        for bytes in parts {
            let printed = part(bytes);
            assert!(
                !printed.contains('/') && !printed.contains(' '),
                "{printed}"
            );
            assert_eq!(parse_part(&printed, "id").unwrap(), bytes, "{printed}");
        }
        assert_eq!(part(b"a/b c%"), "a%2Fb%20c%25");
        assert_eq!(part("利用者".as_bytes()), "利用者");
        assert_eq!(part(b"a\xffb"), "a%FFb");
        assert_eq!(parse_part("a%2fb", "id").unwrap(), b"a/b");
        for bad in ["50%", "%zz", "%2", "a%g0"] {
            assert!(parse_part(bad, "id").is_err(), "{bad}");
        }
        let key = Key::new("u/1", "POST /x", b"\xff").unwrap();
        assert_eq!(show(&key), "u%2F1/POST%20%2Fx/%FF");
        assert_eq!(parse_joined(&show(&key)).unwrap(), key);
        assert!(parse_joined("a/b").is_err());
    }
}
