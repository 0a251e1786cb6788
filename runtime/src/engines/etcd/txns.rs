//! A lock's queue on etcd: its keys, and the transactions that join, leave and read it.
//!
//! Every contender for the lock `K` writes its own entry, `<prefix>:{K}/<owner token>`, bound
//! to a lease; its value is its kind's tag (`W` a writer, `R` a reader, `P<n>` a permit of a
//! semaphore of `n`), a space and the holder's label. The entries are ordered by their
//! creation revision (etcd's global revision at the write that created them), which is also
//! the token (`engines/queue/order.rs` says who holds): etcd's revision only grows, across
//! leader changes.

use crate::engines::queue::order::{kind_of, tag, Entry};
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

/// The kind of an entry's value, and its label.
fn parse_value(value: &str) -> (Option<LockKind>, &str) {
    let (tag, label) = value.split_once(' ').unwrap_or((value, ""));
    (kind_of(tag), label)
}

impl Queue {
    pub(crate) fn of(prefix: &str, key: &str) -> Queue {
        let mut start = lock_name(prefix, key);
        start.push('/');
        Queue { start }
    }

    /// `owner`'s entry.
    pub(crate) fn entry(&self, owner: &Owner) -> String {
        self.entry_of(owner.as_str())
    }

    /// The entry of the owner token `owner`.
    fn entry_of(&self, owner: &str) -> String {
        format!("{}{owner}", self.start)
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

    /// Deletes `entry` if it is still the one read (created at the same revision).
    pub(crate) fn remove(&self, entry: &Entry<i64>) -> Txn {
        let key = self.entry_of(&entry.owner);
        Txn::new()
            .when([Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                entry.token as i64,
            )])
            .and_then([TxnOp::delete(key.as_str(), None)])
    }

    /// The owner whose entry `key` (a full etcd key of this queue) is.
    pub(crate) fn owner_of<'a>(&self, key: &'a [u8]) -> Option<&'a [u8]> {
        key.strip_prefix(self.start.as_bytes())
    }

    /// The entries a range read of this queue returned, oldest first.
    pub(crate) fn entries(&self, kvs: &[KeyValue]) -> Vec<Entry<i64>> {
        kvs.iter()
            .filter_map(|kv| {
                let owner = self.owner_of(kv.key())?;
                let value = String::from_utf8_lossy(kv.value());
                let (kind, label) = parse_value(&value);
                Some(Entry {
                    owner: String::from_utf8_lossy(owner).into_owned(),
                    token: kv.create_revision() as u64,
                    lease: kv.lease(),
                    kind,
                    label: label.to_owned(),
                })
            })
            .collect()
    }

    /// The entries read by the last operation of `response` (a read of this queue).
    pub(crate) fn last_read(&self, response: &TxnResponse) -> Vec<Entry<i64>> {
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

    #[test]
    fn a_value_is_a_tag_and_a_label() {
        assert_eq!(
            parse_value("P3 host:1 (blue)"),
            (Some(LockKind::Permits(3)), "host:1 (blue)")
        );
        assert_eq!(
            parse_value(&format!("{} ", tag(LockKind::Read))).0,
            Some(LockKind::Read)
        );
        assert_eq!(parse_value("X label").0, None);
    }
}
