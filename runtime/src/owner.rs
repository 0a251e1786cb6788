//! Owner tokens: who holds a lock.

use std::fmt;

/// 20 random bytes from the operating system's CSPRNG, hex-encoded: unguessable, and new for every
/// acquisition, so a previous holder's token can never release or renew a later lease.
///
/// `Default` is the empty token, which no acquisition ever uses: what is left after a token was
/// moved out.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Owner(String);

const HEX: &[u8; 16] = b"0123456789abcdef";

impl Owner {
    pub(crate) fn random() -> Owner {
        let mut bytes = [0u8; 20];
        // A machine without an entropy source cannot produce safe owner tokens; there is no
        // degraded mode worth offering.
        getrandom::fill(&mut bytes).expect("the operating system's random number generator failed");
        let mut hex = String::with_capacity(40);
        for byte in bytes {
            hex.push(HEX[(byte >> 4) as usize] as char);
            hex.push(HEX[(byte & 0xf) as usize] as char);
        }
        Owner(hex)
    }

    /// A caller-chosen token, for the conformance suite's ownership tests.
    pub(crate) fn from_raw(token: &str) -> Owner {
        Owner(token.to_owned())
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// Owner tokens are credentials: debug output shows only a prefix.
impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = self.0.get(..6).unwrap_or(&self.0);
        write!(f, "Owner({shown}…)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_40_hex_chars_and_differ() {
        let a = Owner::random();
        let b = Owner::random();
        assert_eq!(a.as_str().len(), 40);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
