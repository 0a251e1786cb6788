//! A process's own channel for the handovers addressed to its waiters.
//!
//! A release that hands a lock to its first queued waiter (`release.lua`) announces it with one
//! message. On the key's channel, every process waiting for the key reads that message, and all
//! but one wake up for nothing: with two processes taking turns, each handover woke both. A
//! waiter whose process has a channel of its own names it in its queue entry (`queue.lua`),
//! and the release publishes the handover there, with the key's channel in the message so that
//! the process routes it to the waiter ([`Channels::deliver`](crate::wait::Channels::deliver)).
//!
//! The channel is subscribed on every notification connection as it opens
//! ([`Subscriber`](super::pubsub::Subscriber)). A handover published while it is not (the
//! connection broke, or the first waiter asked before it opened) is not lost for good: the
//! waiter's lock is granted on the server all the same, and the waiter finds it its own when it
//! next asks. A server that refuses the subscription (an ACL without the channel) switches the
//! channel off for the process: entries stop naming it, and handovers go to the key's channel.
//!
//! Redis Cluster has none: sharded pub/sub needs a channel in the key's slot, which one channel
//! per process cannot be.

use crate::lock::owner::Owner;
use std::sync::atomic::{AtomicBool, Ordering};

pub(crate) struct HandoverChannel {
    name: String,
    refused: AtomicBool,
}

impl HandoverChannel {
    /// A new channel for this process under `prefix`: `<prefix>:handover:<16 random hex digits>`
    /// (inside the `&<prefix>:*` channels the ACL rules grant).
    pub(crate) fn new(prefix: &str) -> HandoverChannel {
        let id = Owner::random();
        HandoverChannel {
            name: format!("{prefix}:handover:{}", &id.as_str()[..16]),
            refused: AtomicBool::new(false),
        }
    }

    /// The channel's name, unless the server refused it (then handovers go to the key's channel).
    pub(crate) fn usable(&self) -> Option<&str> {
        (!self.refused.load(Ordering::Relaxed)).then_some(self.name.as_str())
    }

    /// The channel's name, whether usable or not (to subscribe to it).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The server refused the subscription: from now on no record names the channel.
    pub(crate) fn refuse(&self) {
        self.refused.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_are_per_process_and_can_be_switched_off() {
        let a = HandoverChannel::new("app");
        let b = HandoverChannel::new("app");
        assert!(a.name().starts_with("app:handover:"));
        assert_eq!(a.name().len(), "app:handover:".len() + 16);
        assert_ne!(a.name(), b.name());
        assert_eq!(a.usable(), Some(a.name()));
        a.refuse();
        assert_eq!(a.usable(), None);
    }
}
