//! Redis Cluster hash slots: which of the 16384 slots a key lives in.
//!
//! Every key of one lock — the lock key `<prefix>:{<key>}` and its channel
//! `<prefix>:{<key>}:released` — carries the same hash tag `{<key>}`, so they share a slot and
//! every script sees its keys on one node.

/// The number of hash slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// The slot of `key`: CRC16 (XMODEM) of its hash tag — the part between the first `{` and the
/// next `}`, when that is not empty — or of the whole key, modulo 16384.
pub(crate) fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = match bytes.iter().position(|&b| b == b'{') {
        Some(open) => match bytes[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
            _ => bytes,
        },
        None => bytes,
    };
    crc16_xmodem(hashed) % SLOTS
}

/// CRC-16/XMODEM (polynomial 0x1021, initial value 0), as Redis Cluster computes it.
fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_cluster_keyslot() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.0.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("bar"), 5061);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("t:{order:7}"), slot_of("t:{order:7}:released"));
        // An empty tag hashes the whole key.
        assert_eq!(slot_of("{}abc"), crc16_xmodem(b"{}abc") % SLOTS);
    }
}
