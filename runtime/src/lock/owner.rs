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
        let bytes = RANDOM.with(|random| random.borrow_mut().take());
        let mut hex = String::with_capacity(40);
        for byte in bytes {
            hex.push(HEX[(byte >> 4) as usize] as char);
            hex.push(HEX[(byte & 0xf) as usize] as char);
        }
        Owner(hex)
    }

    /// A caller-chosen token, for the conformance suite's ownership tests.
    #[cfg(any(test, distlock_test_hooks))]
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

/// Bytes per owner token.
const TOKEN_BYTES: usize = 20;
/// Tokens fetched from the operating system at once: one `getrandom` call per 32 acquisitions on
/// a thread instead of one per acquisition (a system call on the hot path).
const TOKENS_PER_FILL: usize = 32;

thread_local! {
    static RANDOM: std::cell::RefCell<RandomBytes> = const {
        std::cell::RefCell::new(RandomBytes {
            buffer: [0; TOKEN_BYTES * TOKENS_PER_FILL],
            used: TOKEN_BYTES * TOKENS_PER_FILL,
        })
    };
}

/// Operating-system randomness, fetched in blocks; every byte is handed out once. (A process that
/// forks without exec would share a block with its child; a tokio program does not fork.)
struct RandomBytes {
    buffer: [u8; TOKEN_BYTES * TOKENS_PER_FILL],
    used: usize,
}

impl RandomBytes {
    fn take(&mut self) -> [u8; TOKEN_BYTES] {
        if self.used == self.buffer.len() {
            // A machine without an entropy source cannot produce safe owner tokens; there is no
            // degraded mode worth offering.
            getrandom::fill(&mut self.buffer)
                .expect("the operating system's random number generator failed");
            self.used = 0;
        }
        let mut token = [0; TOKEN_BYTES];
        token.copy_from_slice(&self.buffer[self.used..self.used + TOKEN_BYTES]);
        // Wipe what was handed out, so the block never holds a live token.
        self.buffer[self.used..self.used + TOKEN_BYTES].fill(0);
        self.used += TOKEN_BYTES;
        token
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

    #[test]
    fn tokens_across_refills_are_all_different() {
        let count = TOKENS_PER_FILL * 3 + 1;
        let tokens: std::collections::HashSet<String> = (0..count)
            .map(|_| Owner::random().as_str().to_owned())
            .collect();
        assert_eq!(tokens.len(), count);
    }
}
