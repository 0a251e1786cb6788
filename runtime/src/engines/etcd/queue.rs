//! A lock's queue on etcd: its keys, and the transactions that join, leave and read it.
//!
//! Every contender for the lock `K` writes its own entry, `<prefix>:{K}/<owner token>`, bound
//! to a lease; its value is its kind (`W` a writer, `R` a reader, `P<n>` a permit of a
//! semaphore of `n`), a space and the holder's label. The entries are ordered by their
//! creation revision (etcd's global revision at the write that created them), and who holds
//! the lock follows from that order alone:
//!
//! - a writer holds it when it is first;
//! - a reader holds it when no writer is ahead of it (a waiting writer holds new readers back);
//! - a permit holds one when fewer than `n` entries are ahead of it.
//!
//! The others wait in that order. A holder's creation revision is its fencing token: etcd's
//! revision only grows, across leader changes, so a writer granted later has a larger token
//! than every earlier holder, reader or writer.

use crate::lock::key::lock_name;
use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};

/// The names of one lock's keys.
pub(crate) struct Queue {
    /// `<prefix>:{K}/`: every entry of the lock starts with it.
    pub(crate) start: String,
}

/// One entry of a queue, as read.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) owner: String,
    pub(crate) revision: i64,
    pub(crate) lease: i64,
    /// What the entry asks for (`None`: a value this version does not know).
    pub(crate) kind: Option<LockKind>,
    pub(crate) label: String,
}

/// The tag an entry of `kind` is written with.
fn tag(kind: LockKind) -> String {
    match kind {
        LockKind::Exclusive => "W".into(),
        LockKind::Read => "R".into(),
        LockKind::Permits(n) => format!("P{n}"),
    }
}

/// The kind of an entry's value, and its label.
fn parse_value(value: &str) -> (Option<LockKind>, &str) {
    let (tag, label) = value.split_once(' ').unwrap_or((value, ""));
    let kind = match tag {
        "W" => Some(LockKind::Exclusive),
        "R" => Some(LockKind::Read),
        _ => tag
            .strip_prefix('P')
            .and_then(|n| n.parse().ok())
            .map(LockKind::Permits),
    };
    (kind, label)
}

/// Whether the entry at `place` of `entries` (oldest first) holds the lock.
pub(crate) fn holds(entries: &[Entry], place: usize) -> bool {
    match entries[place].kind {
        Some(LockKind::Exclusive) => place == 0,
        Some(LockKind::Read) => entries[..place]
            .iter()
            .all(|ahead| ahead.kind == Some(LockKind::Read)),
        Some(LockKind::Permits(n)) => place < n as usize,
        None => false,
    }
}

/// Whether an entry of `kind` may share a queue with one of `other`: a semaphore's entries
/// with the semaphore's only, a lock's (readers and writers) with the lock's only.
pub(crate) fn same_family(kind: LockKind, other: Option<LockKind>) -> bool {
    match (kind, other) {
        (LockKind::Permits(_), Some(LockKind::Permits(_))) => true,
        (LockKind::Permits(_), _) | (_, Some(LockKind::Permits(_))) => false,
        _ => true,
    }
}

impl Queue {
    pub(crate) fn of(prefix: &str, key: &str) -> Queue {
        let mut start = lock_name(prefix, key);
        start.push('/');
        Queue { start }
    }

    /// `owner`'s entry.
    pub(crate) fn entry(&self, owner: &Owner) -> String {
        format!("{}{}", self.start, owner.as_str())
    }

    /// Reads the whole queue, oldest entry first.
    pub(crate) fn read(&self) -> TxnOp {
        TxnOp::get(self.start.as_str(), Some(in_order()))
    }

    /// Reads the queue's first entry: the holder.
    pub(crate) fn read_head(&self) -> TxnOp {
        TxnOp::get(self.start.as_str(), Some(in_order().with_limit(1)))
    }

    /// `owner` joins the queue as `kind` with `lease` (its entry written with `label`), or,
    /// already in it, keeps its place and moves to `lease`; then the queue is read.
    pub(crate) fn join(&self, owner: &Owner, kind: LockKind, lease: i64, label: &str) -> Txn {
        let entry = self.entry(owner);
        let value = format!("{} {label}", tag(kind));
        Txn::new()
            .when([Compare::create_revision(
                entry.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([
                TxnOp::put(
                    entry.as_str(),
                    value,
                    Some(PutOptions::new().with_lease(lease)),
                ),
                self.read(),
            ])
            .or_else([
                TxnOp::put(entry.as_str(), "", Some(moved_to(lease))),
                self.read(),
            ])
    }

    /// Deletes `owner`'s entry if it is there; otherwise reads the holder.
    pub(crate) fn leave(&self, owner: &Owner) -> Txn {
        let entry = self.entry(owner);
        Txn::new()
            .when([Compare::create_revision(
                entry.as_str(),
                CompareOp::Greater,
                0,
            )])
            .and_then([TxnOp::delete(entry.as_str(), None)])
            .or_else([self.read_head()])
    }

    /// Moves `owner`'s entry to `lease` if it is there; otherwise reads the holder.
    pub(crate) fn renew(&self, owner: &Owner, lease: i64) -> Txn {
        let entry = self.entry(owner);
        Txn::new()
            .when([Compare::create_revision(
                entry.as_str(),
                CompareOp::Greater,
                0,
            )])
            .and_then([TxnOp::put(entry.as_str(), "", Some(moved_to(lease)))])
            .or_else([self.read_head()])
    }

    /// The key of `entry`.
    pub(crate) fn name(&self, entry: &Entry) -> String {
        format!("{}{}", self.start, entry.owner)
    }

    /// Deletes `entry` if it is still the one read (created at the same revision).
    pub(crate) fn remove(&self, entry: &Entry) -> Txn {
        let key = self.name(entry);
        Txn::new()
            .when([Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                entry.revision,
            )])
            .and_then([TxnOp::delete(key.as_str(), None)])
    }

    /// The entries a range read of this queue returned, oldest first.
    pub(crate) fn entries(&self, kvs: &[KeyValue]) -> Vec<Entry> {
        kvs.iter()
            .filter_map(|kv| {
                let owner = kv.key().strip_prefix(self.start.as_bytes())?;
                let value = String::from_utf8_lossy(kv.value());
                let (kind, label) = parse_value(&value);
                Some(Entry {
                    owner: String::from_utf8_lossy(owner).into_owned(),
                    revision: kv.create_revision(),
                    lease: kv.lease(),
                    kind,
                    label: label.to_owned(),
                })
            })
            .collect()
    }

    /// The entries read by the last operation of `response` (a read of this queue).
    pub(crate) fn last_read(&self, response: &TxnResponse) -> Vec<Entry> {
        match response.op_responses().pop() {
            Some(TxnOpResponse::Get(read)) => self.entries(read.kvs()),
            _ => Vec::new(),
        }
    }
}

/// Oldest entry first.
fn in_order() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
}

/// A write that keeps the value and moves the key to `lease`.
fn moved_to(lease: i64) -> PutOptions {
    PutOptions::new().with_lease(lease).with_ignore_value()
}

/// The lock key (without the prefix) a queue entry's name belongs to.
pub(crate) fn key_of<'a>(prefix: &str, entry: &'a str) -> Option<&'a str> {
    let rest = entry.strip_prefix(prefix)?.strip_prefix(":{")?;
    let (key, _owner) = rest.split_once("}/")?;
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_named_by_lock_and_owner() {
        let queue = Queue::of("distlock", "order:7");
        let owner = Owner::from_raw("ab12");
        assert_eq!(queue.entry(&owner), "distlock:{order:7}/ab12");
        assert_eq!(
            key_of("distlock", "distlock:{order:7}/ab12"),
            Some("order:7")
        );
        assert_eq!(key_of("distlock", "other:{order:7}/ab12"), None);
        assert_eq!(key_of("distlock", "distlock:{order:7}"), None);
    }

    fn queue(kinds: &[LockKind]) -> Vec<Entry> {
        kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| {
                let value = format!("{} host:1 (blue)", tag(*kind));
                let (kind, label) = parse_value(&value);
                assert_eq!(label, "host:1 (blue)");
                Entry {
                    owner: format!("o{i}"),
                    revision: 10 + i as i64,
                    lease: 1,
                    kind,
                    label: label.to_owned(),
                }
            })
            .collect()
    }

    #[test]
    fn who_holds_follows_from_the_order() {
        use LockKind::{Exclusive as W, Permits as P, Read as R};
        let held = |kinds: &[LockKind]| {
            let entries = queue(kinds);
            (0..entries.len())
                .map(|place| holds(&entries, place))
                .collect::<Vec<_>>()
        };
        assert_eq!(held(&[W, W, R]), [true, false, false]);
        assert_eq!(held(&[R, R, W, R]), [true, true, false, false]);
        assert_eq!(held(&[P(2), P(2), P(2)]), [true, true, false]);
        assert!(same_family(R, Some(W)));
        assert!(!same_family(P(2), Some(R)));
        assert!(!same_family(W, Some(P(3))));
        assert_eq!(parse_value("X label").0, None);
    }
}
