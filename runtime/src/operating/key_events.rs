//! The raw events of one lock key as engines report them (Redis keyspace notifications), before
//! the backend reads the lock's state after each ([`LockEvents`](crate::LockEvents)).

use tokio::sync::mpsc;

/// Whether [`Backend::events`](crate::Backend::events) may turn on the server's keyspace
/// notifications.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notifications {
    /// Fail, naming the setting, when a server does not send them (the default choice: an
    /// application should not change server settings behind its operators' backs).
    Require,
    /// Add the flags that are missing to `notify-keyspace-events` (needs `CONFIG SET`).
    Enable,
}

/// One thing that happened to a lock key on one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyEvent {
    /// A keyspace notification: `set`, `expire`, `expired`, `setrange`, `del`, `evicted`, …
    Notified { server: String, event: String },
    /// The subscription was lost and is in force again: events in between were missed.
    Resubscribed { server: String },
    /// The subscription was lost; the engine keeps trying to restore it.
    Interrupted { server: String, reason: String },
}

/// The events of one key, from every server that holds copies of it.
pub(crate) struct KeyEvents {
    receiver: mpsc::UnboundedReceiver<KeyEvent>,
}

/// Where the followers of a key's servers send its events. Followers stop when every
/// [`KeyEvents`] is dropped ([`closed`](Self::closed)).
#[derive(Clone)]
pub(crate) struct KeyEventSender(mpsc::UnboundedSender<KeyEvent>);

impl KeyEvents {
    pub(crate) fn channel() -> (KeyEventSender, KeyEvents) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (KeyEventSender(sender), KeyEvents { receiver })
    }

    /// The next event; `None` once every follower stopped.
    ///
    /// # Cancel safety
    /// Cancel safe: an event not returned stays queued.
    pub(crate) async fn next(&mut self) -> Option<KeyEvent> {
        self.receiver.recv().await
    }
}

impl KeyEventSender {
    /// `false` when nobody listens any more.
    pub(crate) fn send(&self, event: KeyEvent) -> bool {
        self.0.send(event).is_ok()
    }

    /// Resolves when nobody listens any more.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Only observes: dropping the future changes nothing.
    pub(crate) async fn closed(&self) {
        self.0.closed().await
    }
}
