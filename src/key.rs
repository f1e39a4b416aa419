//! Idempotency keys: (scope, operation, id), their limits and their B-tree encoding.

use std::fmt;
use std::sync::Arc;

/// Which part of a [`Key`] a [`KeyError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyPart {
    /// The scope (who).
    Scope,
    /// The operation (what).
    Operation,
    /// The client's id.
    Id,
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyPart::Scope => "scope",
            KeyPart::Operation => "operation",
            KeyPart::Id => "id",
        })
    }
}

/// A key part that is empty or longer than [`Key::MAX_PART_LEN`]: what [`Key::new`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    /// The offending part.
    pub part: KeyPart,
    /// Its length in bytes.
    pub len: usize,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (part, max) = (self.part, Key::MAX_PART_LEN);
        match self.len {
            0 => write!(f, "key {part} is empty; it needs 1 to {max} bytes"),
            len => write!(f, "key {part} is {len} bytes; the limit is {max} bytes"),
        }
    }
}

impl std::error::Error for KeyError {}

/// An idempotency key: who (`scope`), what (`operation`) and the client's own key (`id`).
///
/// Two requests are duplicates only when all three parts are equal, so a key sent by tenant A
/// can never replay tenant B's result, and the same client key used for two different
/// operations never collides.
///
/// Each part is a byte string of 1 to [`Key::MAX_PART_LEN`] bytes. Parts are encoded with a
/// length prefix, so `("a:b", "c")` and `("a", "b:c")` are different keys.
///
/// ```
/// use idemstore::Key;
///
/// let key = Key::new("tenant-42", "charge", "4f0c-a1")?;
/// assert_eq!(key.id(), b"4f0c-a1");
/// assert!(Key::new("tenant-42", "charge", "").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A `Key` is cheap to clone: its bytes are shared (reference-counted), so the engine hands
/// one key from the caller to the log, the overlay and the cache without copying it.
#[derive(Clone)]
pub struct Key {
    /// The encoded form: `[len][scope][len][operation][len][id]`.
    encoded: Arc<[u8]>,
    /// A hash of `encoded` ([`hash_of`]), computed once: the engine's maps hash a key on every
    /// lookup.
    hash: u64,
}

/// The hash a key carries, for the maps in memory: foldhash, seeded at random once per
/// process (from the operating system's randomness, through std's `RandomState`), so a client
/// cannot pick keys that collide in them; equal keys hash equally within one process. It is
/// never persisted: the windows' saved filters hash keys with the store's own hash
/// ([`Windows::hash`](crate::tree::Windows::hash)).
pub(crate) fn hash_of(encoded: &[u8]) -> u64 {
    use foldhash::{fast::SeedableRandomState, SharedSeed};
    use std::hash::BuildHasher;
    static SEEDED: std::sync::LazyLock<SeedableRandomState> = std::sync::LazyLock::new(|| {
        let random = std::collections::hash_map::RandomState::new().hash_one(0u8);
        SeedableRandomState::with_seed(random, SharedSeed::global_random())
    });
    SEEDED.hash_one(encoded)
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.hash == other.hash && self.encoded == other.encoded
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// Keys sort by their encoded form, the order of the B-tree.
impl Ord for Key {
    fn cmp(&self, other: &Key) -> std::cmp::Ordering {
        self.encoded.cmp(&other.encoded)
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Key) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Key {
    /// Longest scope, operation or id accepted, in bytes.
    ///
    /// Each part is stored behind a one-byte length, so 255 is the format's own limit.
    pub const MAX_PART_LEN: usize = 255;

    /// Longest review note accepted by
    /// [`Store::mark_needs_review`](crate::Store::mark_needs_review) for a key, in bytes.
    pub const MAX_NOTE_LEN: usize = 4096;

    /// A key part as a printed key shows it: `%`, `/`, whitespace, control characters and
    /// bytes that are not UTF-8 are written `%XX` (each byte, uppercase hex); every other
    /// character is itself. So a printed key (`scope/operation/id`, its `Display`) has
    /// exactly two `/`, no space, and any bytes round-trip.
    ///
    /// ```
    /// use idemstore::Key;
    ///
    /// assert_eq!(Key::printed_part(b"a/b c%"), "a%2Fb%20c%25");
    /// let key = Key::new("u/1", "POST /x", b"\xff")?;
    /// assert_eq!(key.to_string(), "u%2F1/POST%20%2Fx/%FF");
    /// # Ok::<(), idemstore::KeyError>(())
    /// ```
    pub fn printed_part(bytes: &[u8]) -> String {
        PrintedPart(bytes).to_string()
    }

    /// Builds a key from its three parts.
    ///
    /// # Errors
    /// [`KeyError`] when a part is empty or longer than [`Key::MAX_PART_LEN`] bytes; the
    /// error names the part and its length.
    pub fn new(
        scope: impl AsRef<[u8]>,
        operation: impl AsRef<[u8]>,
        id: impl AsRef<[u8]>,
    ) -> Result<Key, KeyError> {
        let parts = [
            (KeyPart::Scope, scope.as_ref()),
            (KeyPart::Operation, operation.as_ref()),
            (KeyPart::Id, id.as_ref()),
        ];
        // Built on the stack, then copied once into the shared allocation.
        let mut encoded = [0u8; 3 * (1 + Key::MAX_PART_LEN)];
        let mut end = 0;
        for (part, bytes) in parts {
            let len = u8::try_from(bytes.len())
                .ok()
                .filter(|len| *len > 0)
                .ok_or(KeyError {
                    part,
                    len: bytes.len(),
                })?;
            encoded[end] = len;
            encoded[end + 1..end + 1 + bytes.len()].copy_from_slice(bytes);
            end += 1 + bytes.len();
        }
        Ok(Key {
            encoded: Arc::from(&encoded[..end]),
            hash: hash_of(&encoded[..end]),
        })
    }

    /// Decodes a key from its stored form; `None` when the bytes are not a valid encoding.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Key> {
        let mut rest = bytes;
        for _ in 0..3 {
            let (&len, tail) = rest.split_first()?;
            if len == 0 || tail.len() < usize::from(len) {
                return None;
            }
            rest = &tail[usize::from(len)..];
        }
        rest.is_empty().then(|| Key {
            encoded: bytes.into(),
            hash: hash_of(bytes),
        })
    }

    /// The encoded bytes used as the B-tree key.
    pub(crate) fn encoded(&self) -> &[u8] {
        &self.encoded
    }

    fn part(&self, index: usize) -> &[u8] {
        let mut rest: &[u8] = &self.encoded;
        let mut i = 0;
        loop {
            let len = usize::from(rest[0]);
            if i == index {
                return &rest[1..=len];
            }
            rest = &rest[1 + len..];
            i += 1;
        }
    }

    /// Who the key belongs to: a user, tenant or account.
    pub fn scope(&self) -> &[u8] {
        self.part(0)
    }

    /// What the key guards: a route, a command, a queue.
    pub fn operation(&self) -> &[u8] {
        self.part(1)
    }

    /// The client's own idempotency key.
    pub fn id(&self) -> &[u8] {
        self.part(2)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({self})")
    }
}

/// Shows the key as `scope/operation/id`, with non-UTF-8 bytes escaped.
/// `scope/operation/id`, each part as [`Key::printed_part`] writes it, so that the three parts
/// are told apart and any bytes can be read back (the `idemstore` tool accepts this form).
impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            PrintedPart(self.scope()),
            PrintedPart(self.operation()),
            PrintedPart(self.id())
        )
    }
}

/// A key part as a key prints it ([`Key::printed_part`]).
struct PrintedPart<'a>(&'a [u8]);

impl fmt::Display for PrintedPart<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let escape = |f: &mut fmt::Formatter<'_>, bytes: &[u8]| {
            bytes.iter().try_for_each(|b| write!(f, "%{b:02X}"))
        };
        for chunk in self.0.utf8_chunks() {
            for c in chunk.valid().chars() {
                if c == '%' || c == '/' || c.is_whitespace() || c.is_control() {
                    escape(f, c.encode_utf8(&mut [0; 4]).as_bytes())?;
                } else {
                    write!(f, "{c}")?;
                }
            }
            escape(f, chunk.invalid())?;
        }
        Ok(())
    }
}
