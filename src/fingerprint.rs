//! Request fingerprints: a fixed-size digest compared on every reserve.

use std::fmt;

/// A 32-byte digest of a request, stored with its key and compared on every reserve.
///
/// The same key sent with a different fingerprint is a client bug (a reused key), not a
/// retry: [`reserve`](crate::Store::reserve) answers
/// [`Reservation::Mismatch`](crate::Reservation::Mismatch) and changes nothing.
///
/// Compute it from the request bytes that must match for a retry to be a duplicate (for
/// HTTP, the method, path and body; never a timestamp or a trace id):
///
/// ```
/// use idemstore::Fingerprint;
///
/// let a = Fingerprint::of(b"POST /charges amount=100");
/// let b = Fingerprint::of_parts([&b"POST"[..], b"/charges", b"amount=100"]);
/// assert_eq!(a, Fingerprint::of(b"POST /charges amount=100"));
/// assert_ne!(a, b);
/// // A caller that already has a digest passes it as it is.
/// let own = Fingerprint::from_bytes([7; 32]);
/// assert_eq!(own.as_bytes(), &[7; 32]);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Fingerprint([u8; Fingerprint::LEN]);

impl Fingerprint {
    /// Size of a fingerprint in bytes.
    pub const LEN: usize = 32;

    /// The BLAKE3 digest of `bytes`.
    pub fn of(bytes: impl AsRef<[u8]>) -> Fingerprint {
        Fingerprint(*blake3::hash(bytes.as_ref()).as_bytes())
    }

    /// The BLAKE3 digest of several parts, each length-prefixed so that moving bytes from one
    /// part to the next changes the digest.
    pub fn of_parts<I, P>(parts: I) -> Fingerprint
    where
        I: IntoIterator<Item = P>,
        P: AsRef<[u8]>,
    {
        let mut hasher = blake3::Hasher::new();
        for part in parts {
            let part = part.as_ref();
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        Fingerprint(*hasher.finalize().as_bytes())
    }

    /// A fingerprint the caller computed itself.
    pub const fn from_bytes(bytes: [u8; Fingerprint::LEN]) -> Fingerprint {
        Fingerprint(bytes)
    }

    /// The digest's bytes.
    pub const fn as_bytes(&self) -> &[u8; Fingerprint::LEN] {
        &self.0
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// The first 8 bytes in hex, enough to tell fingerprints apart in logs.
impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in &self.0[..8] {
            write!(f, "{byte:02x}")?;
        }
        f.write_str("…")
    }
}
