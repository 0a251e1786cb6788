//! Release notifications from Redis: one pub/sub connection per backend, shared by every local
//! waiter. Channels are subscribed on demand and unsubscribed [`SUBSCRIPTION_LINGER`] after
//! their last local waiter left, unless a waiter came back meanwhile (a single server's and
//! Sentinel's tables linger; Redlock's unsubscribe at once). When the connection breaks, every
//! waiter is woken to re-check; the next one that still has to wait subscribes again, over a new
//! connection.
//!
//! Every connection has an epoch, and a subscription is confirmed with the epoch of the
//! connection that carried it (see [`Channels`]): a confirmation recorded after its connection
//! died counts for nothing. Several subscribers (one per Redlock master) can share one table.
//!
//! Subscriptions are coalesced ([`GroupCommit`]): a waiter that finds a few SUBSCRIBEs on their way
//! queues, and the queue goes out as one SUBSCRIBE of many channels. Ten thousand waiters arriving
//! at once cost tens of round trips, not ten thousand in a row.
//!
//! The connection goes to the server its [`Node`] talks to now: for Sentinel, the current
//! primary. When the sentinels switch the primary, [`Subscriber::disconnect`] ends the link, so
//! every waiter re-checks and the next subscription goes to the new one.

use super::diagnose;
use super::group_commit::{Batched, GroupCommit};
use super::node::Node;
use crate::engines::engine::{EngineFailure, EngineResult};
use crate::engines::settings::Timeouts;
use crate::hooks::{self, SharedHooks};
use crate::wait::{Channels, Lingering, OnIdleHook, ReleaseWatch};
use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use redis::aio::PubSubSink;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

/// How long a channel stays subscribed after its last local waiter left: a client that takes
/// turns on a busy key with others waits again within milliseconds, and finds its subscription in
/// place (no SUBSCRIBE, and no UNSUBSCRIBE after each wait). As long as a key is remembered as
/// contended for its releases (`conditional.rs`).
pub(crate) const SUBSCRIPTION_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

pub(crate) struct Subscriber {
    node: Arc<Node>,
    timeouts: Timeouts,
    prefix: String,
    hooks: SharedHooks,
    channels: Arc<Channels>,
    /// Held across each SUBSCRIBE/UNSUBSCRIBE so they reach the server in the order they were
    /// decided (an UNSUBSCRIBE decided before a new waiter's SUBSCRIBE is also sent before it).
    link: tokio::sync::Mutex<Links>,
    /// SUBSCRIBEs, coalesced while others are on their way.
    subscriptions: GroupCommit<Subscriptions>,
    me: Weak<Subscriber>,
}

/// The subscriber's SUBSCRIBEs as [`Batched`] calls: many channels in one command.
struct Subscriptions {
    subscriber: Weak<Subscriber>,
}

#[derive(Default)]
struct Links {
    current: Option<Link>,
}

struct Link {
    sink: PubSubSink,
    epoch: u64,
    alive: Arc<AtomicBool>,
    reader: tokio::task::AbortHandle,
}

/// The reader task's end, however it ends (connection closed, aborted, runtime dropped): the
/// link is marked dead, then the waiters are woken, so that the ones still waiting subscribe
/// again on a new connection rather than on this dead one.
struct LinkEnd {
    alive: Arc<AtomicBool>,
    channels: Arc<Channels>,
    epoch: u64,
}

impl Drop for LinkEnd {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::Release);
        self.channels.link_lost(self.epoch);
    }
}

/// What a subscription attempt on the link with epoch `Ok(epoch)` came to: confirmed there; a
/// transient failure leaves it unconfirmed (the waiter's backoff carries it until it subscribes
/// again); a refusal is the error.
pub(crate) fn settle(
    channels: &Channels,
    channel: &str,
    prefix: &str,
    subscribed: Result<u64, Failure>,
) -> EngineResult<()> {
    match subscribed {
        Ok(epoch) => {
            channels.confirm(channel, epoch);
            Ok(())
        }
        Err(Failure::Transient(err)) => {
            tracing::debug!(
                target: "distlock::wait",
                channel,
                error = %err,
                "release notifications unavailable for now; waiting on backoff until the next subscription"
            );
            Ok(())
        }
        Err(Failure::Permanent(err)) => Err(EngineFailure {
            ambiguous: false,
            ..diagnose::failure(err, prefix)
        }),
    }
}

/// Why a subscription could not be confirmed.
#[derive(Clone)]
pub(crate) enum Failure {
    /// A timeout or a broken connection: the next try may work.
    Transient(String),
    /// The server refused (NOPERM, an unknown command): trying again cannot help.
    Permanent(redis::RedisError),
}

impl From<redis::RedisError> for Failure {
    fn from(err: redis::RedisError) -> Self {
        if diagnose::is_permanent(&err) {
            Failure::Permanent(err)
        } else {
            Failure::Transient(err.to_string())
        }
    }
}

impl From<tokio::time::error::Elapsed> for Failure {
    fn from(_: tokio::time::error::Elapsed) -> Self {
        Failure::Transient("no reply in time".to_owned())
    }
}

impl Subscriber {
    pub(crate) fn new(
        node: Arc<Node>,
        timeouts: Timeouts,
        prefix: &str,
        hooks: SharedHooks,
        channels: Arc<Channels>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Subscriber {
            node,
            timeouts,
            prefix: prefix.to_owned(),
            hooks,
            channels,
            link: tokio::sync::Mutex::default(),
            subscriptions: GroupCommit::new(Arc::new(Subscriptions {
                subscriber: me.clone(),
            })),
            me: me.clone(),
        })
    }

    /// Registers a waiter for `channel`, to be told of every release from now on; the last
    /// waiter out unsubscribes (after the table's linger).
    pub(crate) fn register(&self, channel: &str) -> ReleaseWatch {
        self.channels.register(channel, Some(self.on_idle()))
    }

    /// Subscribes to `channel` and, once the server confirmed it, records the confirmation on
    /// this connection's epoch. A transient failure (timeout, broken connection) leaves the
    /// subscription unconfirmed — the waiter's backoff carries it until it subscribes again; a
    /// server that refuses the subscription is the error.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropping the future after the SUBSCRIBE was sent leaves the server subscribed until the
    /// channel's last local waiter leaves, which unsubscribes (in order, after the SUBSCRIBE). A
    /// channel still queued for a batch is sent with it and then unsubscribed again, unless a
    /// waiter came back for it ([`Subscriptions`]' `abandoned`).
    pub(crate) async fn subscribe_and_confirm(&self, channel: &str) -> EngineResult<()> {
        let subscribed = match self.subscriptions.submit(channel.to_owned()).await {
            Ok(subscribed) => subscribed,
            Err(failure) => Err(Failure::Transient(failure.source.to_string())),
        };
        if subscribed.is_ok() {
            let delay = hooks::read(&self.hooks).confirm_delay;
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
        }
        settle(&self.channels, channel, &self.prefix, subscribed)
    }

    /// Channels with at least one local waiter.
    #[cfg(distlock_test_hooks)]
    pub(crate) fn watched(&self) -> usize {
        self.channels.watched()
    }

    /// SUBSCRIBEs that queued for a batch, since the start.
    #[cfg(distlock_test_hooks)]
    pub(crate) fn batched(&self) -> u64 {
        self.subscriptions.queued()
    }

    /// Subscribes to `channels` on the current connection (opening one if needed), in one
    /// SUBSCRIBE; returns its epoch.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropped after the SUBSCRIBE was queued on the link, the server may still subscribe; the
    /// link's lock is let go with the future, so the channels' last waiters' UNSUBSCRIBEs are
    /// sent after it.
    async fn subscribe(&self, channels: &[String]) -> Result<u64, Failure> {
        let mut links = self.link.lock().await;
        let (mut sink, epoch) = self.connect(&mut links).await?;
        tokio::time::timeout(self.timeouts.response, sink.subscribe(channels)).await??;
        Ok(epoch)
    }

    /// Unsubscribes from `channel` on the live link once its linger is over, unless a waiter
    /// came back for it.
    ///
    /// # Cancel safety
    /// Never dropped by a caller.
    /// Runs as a task of its own (spawned by the idle hook), never dropped by a caller; dropped
    /// with its runtime, it takes the channel out of the table if nobody watches it, so that no
    /// channel lingers for good. An UNSUBSCRIBE not answered within the response timeout is given
    /// up on; it may still run.
    async fn unsubscribe(&self, channel: String) {
        let abandoned = Abandoned {
            channels: &self.channels,
            channel: &channel,
        };
        let links = loop {
            let links = self.link.lock().await;
            match self.channels.lingering_state(&channel) {
                Lingering::Watched => return abandoned.finished(),
                Lingering::Until(until) => {
                    drop(links);
                    tokio::time::sleep_until(until.into()).await;
                }
                Lingering::Gone => break links,
            }
        };
        abandoned.finished();
        if let Some(link) = links
            .current
            .as_ref()
            .filter(|link| link.alive.load(Ordering::Acquire))
        {
            let mut sink = link.sink.clone();
            let _ = tokio::time::timeout(self.timeouts.response, sink.unsubscribe(&channel)).await;
        }
    }

    /// The live link's sink, or a new link: a pub/sub connection to the server the node talks to
    /// now, with a reader task that notifies `channels`.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropped before the connection is made, nothing is kept (the next caller tries again); once
    /// it is made, the link and its reader task are set up with no await.
    async fn connect(&self, links: &mut Links) -> Result<(PubSubSink, u64), Failure> {
        if let Some(link) = links
            .current
            .as_ref()
            .filter(|link| link.alive.load(Ordering::Acquire))
        {
            return Ok((link.sink.clone(), link.epoch));
        }
        // The node bounds its own lookup (a Sentinel asks the sentinels, within its timeout).
        let client = self.node.current_client().await?;
        let pubsub =
            tokio::time::timeout(self.timeouts.connect, client.get_async_pubsub()).await??;
        let (sink, mut stream) = pubsub.split();
        let epoch = self.channels.new_link();
        let alive = Arc::new(AtomicBool::new(true));
        let end = LinkEnd {
            alive: alive.clone(),
            channels: self.channels.clone(),
            epoch,
        };
        let channels = self.channels.clone();
        channels.link_up(epoch);
        #[cfg(distlock_test_hooks)]
        let test_hooks = self.hooks.clone();
        let reader = tokio::spawn(async move {
            let _end = end;
            while let Some(message) = stream.next().await {
                #[cfg(distlock_test_hooks)]
                if delay_handover(&test_hooks, &channels, &message) {
                    continue;
                }
                channels.deliver(message.get_channel_name(), message.get_payload_bytes());
            }
        });
        links.current = Some(Link {
            sink: sink.clone(),
            epoch,
            alive,
            reader: reader.abort_handle(),
        });
        self.subscribe_handover_channel(sink.clone()).await;
        Ok((sink, epoch))
    }

    /// Subscribes a new link to this process's handover channel, if it has one. A transient
    /// failure is let be (a handover announced meanwhile is found by its waiter's next ask); a
    /// refusal switches the channel off, so that handovers go to the keys' channels.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropped before the server answered, the channel may or may not be subscribed on this
    /// link; either way nothing is lost but the speed of handovers announced on it.
    async fn subscribe_handover_channel(&self, mut sink: PubSubSink) {
        let Some(channel) = self.node.handover_channel() else {
            return;
        };
        let subscribed =
            tokio::time::timeout(self.timeouts.response, sink.subscribe(channel.name()))
                .await
                .map_err(Failure::from)
                .and_then(|done| done.map_err(Failure::from));
        match subscribed {
            Ok(()) => {}
            Err(Failure::Permanent(err)) => {
                channel.refuse();
                tracing::warn!(
                    target: "distlock::wait",
                    channel = channel.name(),
                    error = %err,
                    "the server refused this process's handover channel; handovers are announced on each key's channel instead (grant the user the channels `&{}:*`)",
                    self.prefix
                );
            }
            Err(Failure::Transient(err)) => tracing::debug!(
                target: "distlock::wait",
                channel = channel.name(),
                error = %err,
                "handover channel not subscribed on this connection; waiters find handovers by asking"
            ),
        }
    }

    /// Ends the current link (the server it goes to is no longer the one the node talks to):
    /// every waiter is woken to re-check, and the next subscription opens a new connection.
    pub(crate) fn disconnect(&self) {
        let Some(me) = self.me.upgrade() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            if let Some(link) = me.link.lock().await.current.take() {
                link.reader.abort();
            }
        });
    }

    /// Ends the current link and waits until it is ended (the backend shut down).
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropped while waiting for the link's lock, nothing changed; after it, the link is gone.
    pub(crate) async fn close(&self) {
        if let Some(link) = self.link.lock().await.current.take() {
            link.reader.abort();
        }
    }

    /// What the channel's last local waiter calls on leaving: an UNSUBSCRIBE in the background.
    pub(crate) fn on_idle(&self) -> OnIdleHook {
        let me = self.me.clone();
        Arc::new(move |channel| {
            let (Some(me), Ok(runtime)) = (me.upgrade(), tokio::runtime::Handle::try_current())
            else {
                return;
            };
            runtime.spawn(async move { me.unsubscribe(channel).await });
        })
    }
}

impl Batched for Subscriptions {
    type Item = String;
    type Answer = Result<u64, Failure>;

    /// One SUBSCRIBE for every channel; each is answered with its outcome.
    fn run<'a>(&'a self, channels: &'a [String]) -> BoxFuture<'a, EngineResult<Vec<Self::Answer>>> {
        Box::pin(async move {
            let subscribed = match self.subscriber.upgrade() {
                Some(subscriber) => subscriber.subscribe(channels).await,
                None => Err(Failure::Transient("the backend was dropped".to_owned())),
            };
            Ok(vec![subscribed; channels.len()])
        })
    }

    /// The waiter left while its channel was in a batch: its idle hook's UNSUBSCRIBE may have
    /// gone out before this SUBSCRIBE, so the channel is unsubscribed again unless a waiter came
    /// back for it.
    fn abandoned(self: &Arc<Self>, channel: String, _subscribed: Self::Answer) {
        self.abandoned_unanswered(channel);
    }

    fn abandoned_unanswered(self: &Arc<Self>, channel: String) {
        if let Some(subscriber) = self.subscriber.upgrade() {
            (subscriber.on_idle())(channel);
        }
    }
}

/// Takes a lingering channel out of the table when the task waiting out its linger is dropped
/// before it finished ([`Channels::linger_abandoned`]).
struct Abandoned<'a> {
    channels: &'a Channels,
    channel: &'a str,
}

impl Abandoned<'_> {
    /// The task finished with the channel: nothing to take out.
    fn finished(self) {
        std::mem::forget(self);
    }
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        self.channels.linger_abandoned(self.channel);
    }
}

/// Test hook: a handover message delivered only after `handover_message_delay`; `true` when it
/// was held back.
#[cfg(distlock_test_hooks)]
fn delay_handover(
    test_hooks: &SharedHooks,
    channels: &Arc<Channels>,
    message: &redis::Msg,
) -> bool {
    let delay = hooks::read(test_hooks).handover_message_delay;
    if delay.is_zero() || !message.get_payload_bytes().starts_with(b"G") {
        return false;
    }
    let (channels, channel) = (channels.clone(), message.get_channel_name().to_owned());
    let payload = message.get_payload_bytes().to_vec();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        channels.deliver(&channel, &payload);
    });
    true
}
