//! Release notifications, as local waiters see them: one generation counter per watched channel,
//! bumped on every release message. A waiter remembers the generation when it registers, so any
//! release after its registration wakes it, however late it starts waiting.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// The channels local waiters watch, and how many waiters each has.
#[derive(Default)]
pub(crate) struct Channels {
    entries: Mutex<HashMap<String, Entry>>,
}

struct Entry {
    generation: watch::Sender<u64>,
    watchers: usize,
    /// The server confirmed the subscription on the current connection.
    confirmed: bool,
}

/// Called with a channel's name when its last watcher leaves.
pub(crate) type OnIdleHook = Arc<dyn Fn(String) + Send + Sync>;

/// One waiter's registration for one channel. Dropping it unregisters; the last one out calls
/// the store's idle hook (Redis: UNSUBSCRIBE).
pub(crate) struct ReleaseWatch {
    receiver: watch::Receiver<u64>,
    channels: Arc<Channels>,
    channel: String,
    on_idle: Option<OnIdleHook>,
}

impl std::fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseWatch")
            .field("channel", &self.channel)
            .finish()
    }
}

impl Channels {
    /// Registers a waiter; the returned watch fires on every notification from now on.
    pub(crate) fn register(
        self: &Arc<Self>,
        channel: &str,
        on_idle: Option<OnIdleHook>,
    ) -> ReleaseWatch {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let entry = entries.entry(channel.to_owned()).or_insert_with(|| Entry {
            generation: watch::Sender::new(0),
            watchers: 0,
            confirmed: false,
        });
        entry.watchers += 1;
        ReleaseWatch {
            receiver: entry.generation.subscribe(),
            channels: self.clone(),
            channel: channel.to_owned(),
            on_idle,
        }
    }

    /// A release was announced on `channel`.
    pub(crate) fn notify(&self, channel: &str) {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = entries.get(channel) {
            entry.generation.send_modify(|generation| *generation += 1);
        }
    }

    /// The notification connection broke: messages may have been lost, so every waiter re-checks
    /// (and re-subscribes).
    pub(crate) fn connection_lost(&self) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        for entry in entries.values_mut() {
            entry.confirmed = false;
            entry.generation.send_modify(|generation| *generation += 1);
        }
    }

    pub(crate) fn confirm(&self, channel: &str) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = entries.get_mut(channel) {
            entry.confirmed = true;
        }
    }

    pub(crate) fn is_watched(&self, channel: &str) -> bool {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.contains_key(channel)
    }

    /// Channels with at least one local waiter.
    pub(crate) fn watched(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn unregister(&self, channel: &str) -> bool {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = entries.get_mut(channel) else {
            return false;
        };
        entry.watchers -= 1;
        if entry.watchers > 0 {
            return false;
        }
        entries.remove(channel);
        true
    }
}

impl ReleaseWatch {
    /// Resolves at the next release announced after registration (or after the previous call).
    pub(crate) async fn released(&mut self) {
        // The sender lives as long as any registration, and we are one: `changed` cannot fail.
        let _ = self.receiver.changed().await;
    }

    /// `false` once the notification connection broke since this watch was confirmed: the
    /// waiter must subscribe again before it can rely on notifications.
    pub(crate) fn is_confirmed(&self) -> bool {
        let entries = self
            .channels
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        entries
            .get(&self.channel)
            .is_some_and(|entry| entry.confirmed)
    }
}

impl Drop for ReleaseWatch {
    fn drop(&mut self) {
        if self.channels.unregister(&self.channel) {
            if let Some(on_idle) = &self.on_idle {
                on_idle(std::mem::take(&mut self.channel));
            }
        }
    }
}
