//! Who holds a lock follows from the order of its queue alone. Every contender writes one
//! entry, which the store numbers in the order entries are written; then:
//!
//! - a writer holds the lock when it is first;
//! - a reader holds it when no writer is ahead of it (a waiting writer holds new readers back);
//! - a permit holds one when fewer than `n` entries are ahead of it.
//!
//! The others wait in that order. A holder's number is its fencing token: the store's numbers
//! only grow, so a writer granted later has a larger token than every earlier holder, reader or
//! writer.

use crate::lock::kind::LockKind;

/// One entry of a queue, as read.
#[derive(Debug, Clone)]
pub(crate) struct Entry<L> {
    /// The owner token of the contender that wrote it.
    pub(crate) owner: String,
    /// Its number in the store's order: its place, and its holder's fencing token.
    pub(crate) token: u64,
    /// What keeps its time (the store's [`Lease`](super::store::Store::Lease)).
    pub(crate) lease: L,
    /// What it asks for (`None`: a kind this version does not know, which holds nothing).
    pub(crate) kind: Option<LockKind>,
    /// Its holder's label, for operators.
    pub(crate) label: String,
}

/// Whether the entry at `place` of `entries` (oldest first) holds the lock.
pub(crate) fn holds<L>(entries: &[Entry<L>], place: usize) -> bool {
    match entries[place].kind {
        Some(LockKind::Exclusive) => place == 0,
        Some(LockKind::Read) => entries[..place]
            .iter()
            .all(|ahead| ahead.kind == Some(LockKind::Read)),
        Some(LockKind::Permits(n)) => place < n as usize,
        None => false,
    }
}

/// The entries of `ahead` (oldest first) whose going may let a waiter of `kind` behind them
/// hold: a writer's predecessor, a reader's nearest writer ahead, a permit's holders (the first
/// `n`).
#[cfg_attr(not(any(feature = "mysql", feature = "zookeeper")), allow(dead_code))]
pub(crate) fn blockers<L>(ahead: &[Entry<L>], kind: LockKind) -> Vec<&Entry<L>> {
    match kind {
        LockKind::Exclusive => ahead.last().into_iter().collect(),
        LockKind::Read => ahead
            .iter()
            .rev()
            .find(|entry| entry.kind != Some(LockKind::Read))
            .or(ahead.last())
            .into_iter()
            .collect(),
        LockKind::Permits(n) => ahead.iter().take(n as usize).collect(),
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

/// The tag an entry of `kind` is stored with: `W` a writer, `R` a reader, `P<n>` a permit of
/// a semaphore of `n`.
pub(crate) fn tag(kind: LockKind) -> String {
    match kind {
        LockKind::Exclusive => "W".into(),
        LockKind::Read => "R".into(),
        LockKind::Permits(n) => format!("P{n}"),
    }
}

/// The kind a [`tag`] stands for (`None`: one this version does not know).
pub(crate) fn kind_of(tag: &str) -> Option<LockKind> {
    match tag {
        "W" => Some(LockKind::Exclusive),
        "R" => Some(LockKind::Read),
        _ => tag
            .strip_prefix('P')
            .and_then(|n| n.parse().ok())
            .map(LockKind::Permits),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(kinds: &[LockKind]) -> Vec<Entry<()>> {
        kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| Entry {
                owner: format!("o{i}"),
                token: 10 + i as u64,
                lease: (),
                kind: kind_of(&tag(*kind)),
                label: String::new(),
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
        assert_eq!(kind_of("X"), None);
        assert_eq!(kind_of(&tag(P(12))), Some(P(12)));
    }
}
