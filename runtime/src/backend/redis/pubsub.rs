//! Release notifications from Redis: one pub/sub connection per backend, shared by every local
//! waiter. Channels are subscribed on demand and unsubscribed when their last local waiter
//! leaves. When the connection breaks, every waiter is woken to re-check; the next one that
//! still has to wait subscribes again, over a new connection.

use super::Timeouts;
use crate::wait::{Channels, OnIdleHook, ReleaseWatch};
use futures_util::StreamExt;
use redis::aio::PubSubSink;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

pub(crate) struct Subscriber {
    client: redis::Client,
    timeouts: Timeouts,
    channels: Arc<Channels>,
    /// Held across each SUBSCRIBE/UNSUBSCRIBE so they reach the server in the order they were
    /// decided (an UNSUBSCRIBE decided before a new waiter's SUBSCRIBE is also sent before it).
    link: tokio::sync::Mutex<Option<Link>>,
    me: Weak<Subscriber>,
}

struct Link {
    sink: PubSubSink,
    alive: Arc<AtomicBool>,
}

/// Cleared when the reader task ends, however it ends (connection closed, runtime dropped).
struct AliveFlag(Arc<AtomicBool>);

impl Drop for AliveFlag {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

impl Subscriber {
    pub(crate) fn new(client: redis::Client, timeouts: Timeouts) -> Arc<Self> {
        Arc::new_cyclic(|me| Subscriber {
            client,
            timeouts,
            channels: Arc::default(),
            link: tokio::sync::Mutex::new(None),
            me: me.clone(),
        })
    }

    /// Registers a waiter for `channel` and returns once the server confirmed the subscription.
    /// If it cannot be confirmed, the watch still works as a registration and the waiter's
    /// backoff carries it.
    pub(crate) async fn watch(&self, channel: &str) -> ReleaseWatch {
        let watch = self.channels.register(channel, Some(self.on_idle()));
        match self.subscribe(channel).await {
            Ok(()) => self.channels.confirm(channel),
            Err(err) => tracing::debug!(
                target: "distlock::wait",
                channel,
                error = %err,
                "release notifications unavailable; waiting on backoff alone"
            ),
        }
        watch
    }

    /// Channels with at least one local waiter.
    pub(crate) fn watched(&self) -> usize {
        self.channels.watched()
    }

    async fn subscribe(&self, channel: &str) -> Result<(), Failure> {
        let mut link = self.link.lock().await;
        let mut sink = self.connect(&mut link).await?;
        tokio::time::timeout(self.timeouts.response, sink.subscribe(channel)).await??;
        Ok(())
    }

    async fn unsubscribe(&self, channel: String) {
        let link = self.link.lock().await;
        // A waiter may have come back for the channel since its last one left.
        if self.channels.is_watched(&channel) {
            return;
        }
        if let Some(link) = link
            .as_ref()
            .filter(|link| link.alive.load(Ordering::Acquire))
        {
            let mut sink = link.sink.clone();
            let _ = tokio::time::timeout(self.timeouts.response, sink.unsubscribe(&channel)).await;
        }
    }

    async fn connect(&self, link: &mut Option<Link>) -> Result<PubSubSink, Failure> {
        if let Some(link) = link
            .as_ref()
            .filter(|link| link.alive.load(Ordering::Acquire))
        {
            return Ok(link.sink.clone());
        }
        let pubsub =
            tokio::time::timeout(self.timeouts.connect, self.client.get_async_pubsub()).await??;
        let (sink, mut stream) = pubsub.split();
        let alive = Arc::new(AtomicBool::new(true));
        let flag = AliveFlag(alive.clone());
        let channels = self.channels.clone();
        tokio::spawn(async move {
            while let Some(message) = stream.next().await {
                channels.notify(message.get_channel_name());
            }
            // Mark the link dead before waking the waiters, so that the ones still waiting
            // subscribe again on a new connection rather than on this dead one.
            drop(flag);
            channels.connection_lost();
        });
        *link = Some(Link {
            sink: sink.clone(),
            alive,
        });
        Ok(sink)
    }

    fn on_idle(&self) -> OnIdleHook {
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
