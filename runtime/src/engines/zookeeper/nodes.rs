//! Where a lock lives in ZooKeeper: `/<prefix>/<key>` is a lock's queue (a container node,
//! which the ensemble deletes once it stays empty), and each contender's entry a child of it,
//! `<owner>-<kind>-<sequence>`: ephemeral and sequential, so it goes with its session, and
//! ZooKeeper numbers it in the order entries are written. The owner in the name lets a client
//! whose create lost its reply find the node it made.
//!
//! Prefix and key are written byte by byte: letters, digits, `_`, `:` and `-` as they are,
//! every other byte as `%XX` — so no key is a path of several nodes, and none is `.` or `..`.

use crate::engines::queue::order::{kind_of, tag};
use crate::lock::kind::LockKind;
use std::fmt::Write as _;

/// The digits ZooKeeper appends to a sequential node's name.
const SEQUENCE_DIGITS: usize = 10;

/// `text` as one node name.
pub(crate) fn encode(text: &str) -> String {
    let mut name = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b':' | b'-' => name.push(byte as char),
            _ => {
                let _ = write!(name, "%{byte:02X}");
            }
        }
    }
    name
}

/// The text an [`encode`]d name stands for (`None`: a name distlock did not write).
pub(crate) fn decode(name: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(name.len());
    let mut rest = name.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(first);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

/// The paths of one backend's locks.
#[derive(Debug, Clone)]
pub(crate) struct Paths {
    /// `/<prefix>`: every queue is a child of it.
    pub(crate) root: String,
}

impl Paths {
    pub(crate) fn new(prefix: &str) -> Paths {
        Paths {
            root: format!("/{}", encode(prefix)),
        }
    }

    /// The queue of `key`.
    pub(crate) fn queue(&self, key: &str) -> String {
        format!("{}/{}", self.root, encode(key))
    }
}

/// What a new entry's name starts with; ZooKeeper appends its sequence number.
pub(crate) fn entry_prefix(queue: &str, owner: &str, kind: LockKind) -> String {
    format!("{queue}/{owner}-{}-", tag(kind))
}

/// One entry's name, read: whose, what it asks for, and its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Name<'a> {
    pub(crate) owner: &'a str,
    /// `None`: a kind this version does not know, which holds nothing.
    pub(crate) kind: Option<LockKind>,
    pub(crate) sequence: i64,
}

/// Reads an entry's name (`None`: a node distlock did not write).
pub(crate) fn parse(name: &str) -> Option<Name<'_>> {
    let (rest, sequence) = name.split_at_checked(name.len().checked_sub(SEQUENCE_DIGITS)?)?;
    let (owner, tag) = rest.strip_suffix('-')?.split_once('-')?;
    Some(Name {
        owner,
        kind: kind_of(tag),
        sequence: sequence.parse().ok()?,
    })
}

/// The full name of an entry whose kind and sequence are known.
pub(crate) fn entry_name(owner: &str, kind: LockKind, sequence: i64) -> String {
    format!(
        "{owner}-{}-{sequence:0width$}",
        tag(kind),
        width = SEQUENCE_DIGITS
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_one_node_each_and_read_back() {
        for key in ["order:1", "a/b", ".", "..", "tenant 7/ключ", "100%"] {
            let name = encode(key);
            assert!(!name.contains('/') && name != "." && name != "..", "{name}");
            assert_eq!(decode(&name).as_deref(), Some(key));
        }
        assert_eq!(encode("order:1"), "order:1");
        assert_eq!(decode("%G1"), None);
        assert_eq!(Paths::new("app").queue("a/b"), "/app/a%2Fb");
    }

    #[test]
    fn entry_names_carry_owner_kind_and_place() {
        let name = entry_name("ab12", LockKind::Permits(3), 42);
        assert_eq!(name, "ab12-P3-0000000042");
        assert_eq!(
            parse(&name),
            Some(Name {
                owner: "ab12",
                kind: Some(LockKind::Permits(3)),
                sequence: 42
            })
        );
        assert_eq!(parse("ab12-X-0000000001").unwrap().kind, None);
        assert_eq!(parse("zookeeper"), None);
        assert_eq!(parse("ab12-W-00000000x1"), None);
        assert!(entry_prefix("/q", "ab", LockKind::Read).ends_with("/ab-R-"));
    }
}
