//! Release notifications, as local waiters see them: one generation counter per watched channel,
//! bumped on every release message. A waiter remembers the generation when it registers, so any
//! release after its registration wakes it, however late it starts waiting.
//!
//! A subscription is confirmed *on a link*: each notification connection gets a new epoch, and a
//! confirmation counts only while its link is up. A connection that dies between the server's
//! SUBSCRIBE reply and the local confirmation therefore leaves the channel unconfirmed, and its
//! waiter subscribes again on the next connection instead of trusting a dead one. Engines with
//! several servers (Redlock) share one table over several links and need confirmations on
//! enough of them to be told of any release.
//!
//! A table may let its channels linger ([`Channels::lingering`]): a channel whose last waiter
//! left stays subscribed, and confirmed, for a while, so that a process that waits for the same
//! key again soon (a client taking turns on a busy key) finds its subscription in place instead of
//! sending SUBSCRIBE and UNSUBSCRIBE around every wait. The store's idle hook then waits out the
//! linger ([`Channels::lingering_state`]) before it unsubscribes.

use crate::hooks::LocalChange;
use crate::util::sparse::shrink_when_sparse;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The channels local waiters watch, and how many waiters each has.
pub(crate) struct Channels {
    state: Mutex<State>,
}

struct State {
    entries: HashMap<String, Entry>,
    /// The epochs of the notification connections that are up.
    live_links: HashSet<u64>,
    /// The next link's epoch.
    next_link: u64,
    /// Confirmations on distinct live links a subscription needs to count as confirmed.
    needed: usize,
    /// How long a channel stays after its last waiter left (zero: it goes at once).
    linger: Duration,
}

struct Entry {
    generation: watch::Sender<u64>,
    watchers: usize,
    /// The links on which the server confirmed the subscription (dead ones are pruned).
    confirmed_on: Vec<u64>,
    /// The owner token of this process's waiter that may be handed the lock (the key's turn
    /// holder), and the fencing token of the handover once it came.
    handover: Option<(String, Option<u64>)>,
    /// When the last waiter left, while none watches a lingering channel.
    idle_since: Option<Instant>,
    /// The store's idle hook was called for this idle spell and has not finished with it.
    lingering: bool,
}

impl State {
    /// Takes `channel` out of the table.
    fn remove(&mut self, channel: &str) {
        self.entries.remove(channel);
        shrink_when_sparse(&mut self.entries);
    }
}

/// Where a channel whose last waiter left stands, for the store's idle hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lingering {
    /// A waiter came back: the channel stays subscribed.
    Watched,
    /// Nobody watches it; it lingers until then.
    Until(Instant),
    /// Gone from the table (now, or before): unsubscribe.
    Gone,
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
    /// A table whose subscriptions count as confirmed once `needed` distinct live links
    /// confirmed them (1 for one server; Redlock over N masters with quorum Q needs N − Q + 1,
    /// so that every quorum of a releasing holder includes a subscribed master).
    pub(crate) fn needing(needed: usize) -> Self {
        Channels::lingering(needed, Duration::ZERO)
    }

    /// [`needing`](Self::needing), each channel kept subscribed for `linger` after its last
    /// waiter left.
    pub(crate) fn lingering(needed: usize, linger: Duration) -> Self {
        Channels {
            state: Mutex::new(State {
                entries: HashMap::new(),
                live_links: HashSet::new(),
                next_link: 0,
                needed,
                linger,
            }),
        }
    }

    /// Channels whose notifications are delivered in-process: one link, always up (epoch 0).
    pub(crate) fn in_process() -> Self {
        let channels = Channels::needing(1);
        let link = channels.new_link();
        channels.link_up(link);
        channels
    }

    /// An epoch for a new notification connection.
    pub(crate) fn new_link(&self) -> u64 {
        let mut state = self.lock();
        state.next_link += 1;
        state.next_link - 1
    }

    /// Registers a waiter; the returned watch fires on every notification from now on.
    pub(crate) fn register(
        self: &Arc<Self>,
        channel: &str,
        on_idle: Option<OnIdleHook>,
    ) -> ReleaseWatch {
        let _changed = LocalChange;
        let mut state = self.lock();
        let entry = state
            .entries
            .entry(channel.to_owned())
            .or_insert_with(|| Entry {
                generation: watch::Sender::new(0),
                watchers: 0,
                confirmed_on: Vec::new(),
                handover: None,
                idle_since: None,
                lingering: false,
            });
        entry.watchers += 1;
        entry.idle_since = None;
        ReleaseWatch {
            receiver: entry.generation.subscribe(),
            channels: self.clone(),
            channel: channel.to_owned(),
            on_idle,
        }
    }

    /// A release was announced on `channel`.
    pub(crate) fn notify(&self, channel: &str) {
        let state = self.lock();
        if let Some(entry) = state.entries.get(channel) {
            entry.generation.send_modify(|generation| *generation += 1);
        }
    }

    /// A message on `channel`: a handover (`G<fence> <owner>` on the key's channel, or
    /// `G<fence> <owner> <key's channel>` on this process's handover channel, `release.lua`)
    /// wakes only the waiter it names, if it is this process's; anything else announces a
    /// release.
    pub(crate) fn deliver(&self, channel: &str, payload: &[u8]) {
        match parse_handover(payload) {
            Some(handover) => self.hand_over(
                handover.channel.unwrap_or(channel),
                handover.owner,
                handover.fence,
            ),
            None => self.notify(channel),
        }
    }

    /// The lock of `channel` was handed over to `owner` with `fence`.
    fn hand_over(&self, channel: &str, owner: &str, fence: u64) {
        let mut state = self.lock();
        let Some(entry) = state.entries.get_mut(channel) else {
            return;
        };
        match &mut entry.handover {
            Some((expected, handed)) if expected == owner => {
                *handed = Some(fence);
                entry.generation.send_modify(|generation| *generation += 1);
            }
            // Another process's waiter: nothing changed for this one's.
            _ => {}
        }
    }

    /// A notification connection with this epoch is up.
    pub(crate) fn link_up(&self, epoch: u64) {
        self.lock().live_links.insert(epoch);
    }

    /// The notification connection with this epoch broke: messages may have been lost, so every
    /// waiter re-checks (and, its confirmation being on a dead link, subscribes again).
    pub(crate) fn link_lost(&self, epoch: u64) {
        let mut state = self.lock();
        state.live_links.remove(&epoch);
        for entry in state.entries.values() {
            entry.generation.send_modify(|generation| *generation += 1);
        }
    }

    /// The server confirmed the subscription to `channel` on the link with this epoch. Whether
    /// that link is still up is decided when the confirmation is read ([`ReleaseWatch::is_confirmed`]).
    pub(crate) fn confirm(&self, channel: &str, epoch: u64) {
        let mut state = self.lock();
        let State {
            entries,
            live_links,
            ..
        } = &mut *state;
        if let Some(entry) = entries.get_mut(channel) {
            entry.confirmed_on.retain(|link| live_links.contains(link));
            if !entry.confirmed_on.contains(&epoch) {
                entry.confirmed_on.push(epoch);
            }
        }
    }

    /// Whether a local waiter watches `channel` now.
    pub(crate) fn is_watched(&self, channel: &str) -> bool {
        let state = self.lock();
        state.entries.get(channel).is_some_and(|e| e.watchers > 0)
    }

    /// Where `channel` stands for the store's idle hook, which unsubscribes on [`Lingering::Gone`]
    /// only: a lingering channel whose time is up leaves the table now. The hook calls this under
    /// the lock that orders its SUBSCRIBEs and UNSUBSCRIBEs, so a waiter that comes for the channel
    /// afterwards subscribes anew, after the UNSUBSCRIBE.
    pub(crate) fn lingering_state(&self, channel: &str) -> Lingering {
        let mut state = self.lock();
        let now = Instant::now();
        let linger = state.linger;
        let Some(entry) = state.entries.get_mut(channel) else {
            return Lingering::Gone;
        };
        if entry.watchers > 0 {
            entry.lingering = false;
            return Lingering::Watched;
        }
        match entry.idle_since.map(|since| since + linger) {
            Some(until) if until > now => Lingering::Until(until),
            _ => {
                state.remove(channel);
                Lingering::Gone
            }
        }
    }

    /// The idle hook for `channel` ended without finishing (its runtime shut down): the channel
    /// leaves the table if nobody watches it, so that it is never left lingering for good.
    pub(crate) fn linger_abandoned(&self, channel: &str) {
        let mut state = self.lock();
        if let Some(entry) = state.entries.get_mut(channel) {
            entry.lingering = false;
            if entry.watchers == 0 {
                state.remove(channel);
            }
        }
    }

    /// Channels with at least one local waiter.
    #[cfg(distlock_test_hooks)]
    pub(crate) fn watched(&self) -> usize {
        let state = self.lock();
        state.entries.values().filter(|e| e.watchers > 0).count()
    }

    /// Unregisters a waiter; `true` when the store's idle hook is to be called: the last waiter
    /// left (and, for a lingering channel, no hook is already waiting out its linger).
    fn unregister(&self, channel: &str) -> bool {
        let _changed = LocalChange;
        let mut state = self.lock();
        let linger = state.linger;
        let Some(entry) = state.entries.get_mut(channel) else {
            return false;
        };
        entry.watchers -= 1;
        if entry.watchers > 0 {
            return false;
        }
        if linger.is_zero() {
            state.remove(channel);
            return true;
        }
        entry.idle_since = Some(Instant::now());
        entry.handover = None;
        !std::mem::replace(&mut entry.lingering, true)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A handover message: `G<fence> <owner>[ <key's channel>]`.
struct Handover<'a> {
    fence: u64,
    owner: &'a str,
    /// The key's channel, when the message came on a process's handover channel.
    channel: Option<&'a str>,
}

fn parse_handover(payload: &[u8]) -> Option<Handover<'_>> {
    let text = std::str::from_utf8(payload.strip_prefix(b"G")?).ok()?;
    let (fence, rest) = text.split_once(' ')?;
    let (owner, channel) = match rest.split_once(' ') {
        Some((owner, channel)) => (owner, Some(channel)),
        None => (rest, None),
    };
    Some(Handover {
        fence: fence.parse().ok()?,
        owner,
        channel,
    })
}

impl ReleaseWatch {
    /// This process's waiter for the key is now `owner` (the turn's holder): a handover to it
    /// wakes this watch, and [`take_handover`](Self::take_handover) returns its token.
    pub(crate) fn expect_handover(&self, owner: &str) {
        let mut state = self.channels.lock();
        if let Some(entry) = state.entries.get_mut(&self.channel) {
            if entry
                .handover
                .as_ref()
                .is_none_or(|(expected, _)| expected != owner)
            {
                entry.handover = Some((owner.to_owned(), None));
            }
        }
    }

    /// The fencing token of a handover to `owner` that came since it was expected, taken (a
    /// second call returns `None`).
    pub(crate) fn take_handover(&self, owner: &str) -> Option<u64> {
        let mut state = self.channels.lock();
        let entry = state.entries.get_mut(&self.channel)?;
        match &mut entry.handover {
            Some((expected, handed)) if expected == owner => handed.take(),
            _ => None,
        }
    }

    /// Resolves at the next release announced after registration (or after the previous call).
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropping the future loses nothing: the generation it waited for stays unseen, and the
    /// next call returns at once if it has moved.
    pub(crate) async fn released(&mut self) {
        // The sender lives as long as any registration, and we are one: `changed` cannot fail.
        let _ = self.receiver.changed().await;
    }

    /// `true` while the subscription is confirmed on enough notification connections that are
    /// up now; `false` once one of them broke (or if it broke before the confirmation was
    /// recorded): the waiter must subscribe again before it can rely on notifications.
    pub(crate) fn is_confirmed(&self) -> bool {
        let state = self.channels.lock();
        let live = state.entries.get(&self.channel).map_or(0, |entry| {
            entry
                .confirmed_on
                .iter()
                .filter(|link| state.live_links.contains(link))
                .count()
        });
        live >= state.needed
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    #[test]
    fn handover_messages_name_a_token_an_owner_and_maybe_a_channel() {
        fn parsed(payload: &[u8]) -> Option<(u64, &str, Option<&str>)> {
            parse_handover(payload)
                .map(|handover| (handover.fence, handover.owner, handover.channel))
        }
        assert_eq!(parsed(b"G17 0a1b"), Some((17, "0a1b", None)));
        assert_eq!(
            parsed(b"G17 0a1b t:{a b}:released"),
            Some((17, "0a1b", Some("t:{a b}:released")))
        );
        // A release announcement is the lock key itself, never a handover.
        assert_eq!(parsed(b"t:{k}"), None);
        assert_eq!(parsed(b"G 0a1b"), None);
        assert_eq!(parsed(b"G17"), None);
        assert_eq!(parsed(b"Gx 0a1b"), None);
    }

    /// A handover on a process's handover channel wakes the waiter of the key's channel it names.
    #[test]
    fn a_handover_on_the_process_channel_reaches_the_keys_waiter() {
        let channels = Arc::new(Channels::in_process());
        let mut watch = channels.register("t:{k}:released", None);
        watch.expect_handover("mine");
        channels.deliver("t:handover:1", b"G5 mine t:{other}:released");
        assert!(
            watch.released().now_or_never().is_none(),
            "woken for another key"
        );
        channels.deliver("t:handover:1", b"G6 mine t:{k}:released");
        assert!(watch.released().now_or_never().is_some());
        assert_eq!(watch.take_handover("mine"), Some(6));
    }

    /// A lingering channel stays confirmed after its last waiter left, so the next waiter finds
    /// it so; the idle hook is called once per idle spell, and the channel leaves the table when
    /// its linger is over (or when the hook is abandoned), never while watched.
    #[test]
    fn a_lingering_channel_stays_confirmed_until_its_linger_is_over() {
        let channels = Arc::new(Channels::lingering(1, Duration::from_secs(3600)));
        let link = channels.new_link();
        channels.link_up(link);
        let idle = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let hook: OnIdleHook = {
            let idle = idle.clone();
            Arc::new(move |_| {
                idle.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            })
        };
        let watch = channels.register("c", Some(hook.clone()));
        channels.confirm("c", link);
        drop(watch);
        assert_eq!(idle.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(!channels.is_watched("c"));
        assert!(matches!(channels.lingering_state("c"), Lingering::Until(_)));

        let again = channels.register("c", Some(hook.clone()));
        assert!(
            again.is_confirmed(),
            "the lingering subscription was forgotten"
        );
        assert_eq!(channels.lingering_state("c"), Lingering::Watched);
        drop(again);
        // The hook of the first idle spell ended when the waiter came back: a new one starts.
        assert_eq!(idle.load(std::sync::atomic::Ordering::SeqCst), 2);
        let third = channels.register("c", Some(hook.clone()));
        drop(third);
        assert_eq!(
            idle.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "a second hook while the first still waits out the linger"
        );
        channels.linger_abandoned("c");
        assert_eq!(channels.lingering_state("c"), Lingering::Gone);
        assert!(!channels.register("c", None).is_confirmed());

        let brief = Arc::new(Channels::lingering(1, Duration::ZERO));
        brief.link_up(brief.new_link());
        drop(brief.register("d", None));
        assert_eq!(brief.lingering_state("d"), Lingering::Gone);
    }

    /// A handover wakes only the waiter it names, once; an announcement wakes every waiter.
    #[test]
    fn a_handover_wakes_only_its_waiter() {
        let channels = Arc::new(Channels::in_process());
        let mut watch = channels.register("c", None);
        watch.expect_handover("mine");

        channels.deliver("c", b"G5 theirs");
        assert!(
            watch.released().now_or_never().is_none(),
            "woken for another waiter"
        );
        assert_eq!(watch.take_handover("mine"), None);

        channels.deliver("c", b"G6 mine");
        assert!(watch.released().now_or_never().is_some());
        assert_eq!(watch.take_handover("mine"), Some(6));
        assert_eq!(watch.take_handover("mine"), None, "taken twice");

        channels.deliver("c", b"c");
        assert!(watch.released().now_or_never().is_some());
        assert_eq!(watch.take_handover("mine"), None);
        // Expecting another owner (the turn moved on) forgets the previous one's.
        channels.deliver("c", b"G7 mine");
        watch.expect_handover("next");
        assert_eq!(watch.take_handover("next"), None);
    }
}
