//! Release notifications in a Redis Cluster: sharded pub/sub. The release script announces a
//! release with `SPUBLISH` on the node that owns the lock's slot (the channel carries the lock's
//! hash tag), and waiters `SSUBSCRIBE` there — a release is not broadcast to every node, as a
//! classic `PUBLISH` is in a cluster.
//!
//! One RESP3 cluster connection per backend carries every subscription; the server's pushes
//! arrive in a callback. Each connection is a link with its own epoch (see [`Channels`]): when
//! it breaks (a node's connection dropped), or a node drops a subscription that a local waiter
//! still needs (its slot moved to another node, its master was demoted), the link is ended —
//! every waiter re-checks the lock and the next subscription goes out on a new connection, to
//! the slot's current owner. (redis-rs also restores sharded subscriptions by itself, but not
//! one whose slot moved; ending the link covers every case the same way.)

use super::cluster_spec::ClusterSpec;
use super::pubsub::{settle, Failure};
use crate::engines::engine::EngineResult;
use crate::engines::settings::Timeouts;
use crate::wait::{Channels, OnIdleHook, ReleaseWatch};
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

pub(crate) struct ShardedSubscriber {
    /// The seeds and credentials of every new link's cluster client.
    spec: ClusterSpec,
    timeouts: Timeouts,
    prefix: String,
    channels: Arc<Channels>,
    /// Held across each SSUBSCRIBE/SUNSUBSCRIBE so they reach the server in the order decided.
    link: tokio::sync::Mutex<Option<Link>>,
    me: Weak<ShardedSubscriber>,
}

struct Link {
    conn: ClusterConnection,
    epoch: u64,
    /// What the link's pushes go to; ending it ends the link.
    pushes: Arc<Pushes>,
    /// A task of the link's runtime that ends the link if the runtime shuts down (the
    /// connection's own tasks die with it, silently).
    watcher: tokio::task::AbortHandle,
}

impl Link {
    fn is_alive(&self) -> bool {
        self.pushes.alive.load(Ordering::Acquire)
    }
}

impl ShardedSubscriber {
    pub(crate) fn new(
        spec: ClusterSpec,
        timeouts: Timeouts,
        prefix: &str,
        channels: Arc<Channels>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| ShardedSubscriber {
            spec,
            timeouts,
            prefix: prefix.to_owned(),
            channels,
            link: tokio::sync::Mutex::default(),
            me: me.clone(),
        })
    }

    /// Ends the current link (the backend shut down): its cluster connection is dropped.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropped while waiting for the link's lock, nothing changed; after it, the link is gone.
    pub(crate) async fn close(&self) {
        if let Some(link) = self.link.lock().await.take() {
            link.watcher.abort();
        }
    }

    /// Registers a waiter for `channel`; the last waiter out unsubscribes.
    pub(crate) fn register(&self, channel: &str) -> ReleaseWatch {
        self.channels.register(channel, Some(self.on_idle()))
    }

    /// Subscribes to `channel` on the node owning its slot and, once confirmed, records the
    /// confirmation on this link. A transient failure leaves it unconfirmed (the waiter's
    /// backoff carries it until it subscribes again); a refusal (NOPERM) is the error.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropping the future after the SSUBSCRIBE was sent leaves the node subscribed until the
    /// channel's last local waiter leaves, which unsubscribes (in order, after the SSUBSCRIBE).
    pub(crate) async fn subscribe_and_confirm(&self, channel: &str) -> EngineResult<()> {
        let subscribed = async {
            let mut link = self.link.lock().await;
            let (mut conn, epoch) = self.connect(&mut link).await?;
            let subscribed = conn.ssubscribe(channel).await;
            if let (Err(err), Some(current)) = (&subscribed, link.as_ref()) {
                if err.is_io_error() || err.is_connection_dropped() {
                    // Broken under us: the next subscription opens a new link.
                    current.pushes.end();
                }
            }
            subscribed.map(|()| epoch)
        };
        let subscribed = match tokio::time::timeout(self.timeouts.connect * 2, subscribed).await {
            Ok(subscribed) => subscribed.map_err(Failure::from),
            Err(elapsed) => Err(Failure::from(elapsed)),
        };
        settle(&self.channels, channel, &self.prefix, subscribed)
    }

    /// Channels with at least one local waiter.
    #[cfg(distlock_test_hooks)]
    pub(crate) fn watched(&self) -> usize {
        self.channels.watched()
    }

    /// The live link's connection, or a new link (a new epoch, a RESP3 connection whose pushes go
    /// to `channels`) when there is none or it ended.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropped while connecting, the new connection is dropped and no link is recorded (the next
    /// caller makes one); its epoch is never used, which is harmless.
    async fn connect(
        &self,
        link: &mut Option<Link>,
    ) -> redis::RedisResult<(ClusterConnection, u64)> {
        if let Some(current) = link.as_ref().filter(|current| current.is_alive()) {
            return Ok((current.conn.clone(), current.epoch));
        }
        if let Some(dead) = link.take() {
            dead.watcher.abort();
        }
        // An epoch drawn for an attempt that fails (or is cancelled) is never used; harmless.
        let epoch = self.channels.new_link();
        let pushes = Arc::new(Pushes {
            channels: self.channels.clone(),
            epoch,
            alive: Arc::new(AtomicBool::new(true)),
        });
        let callback = pushes.clone();
        let client = self
            .spec
            .builder(self.timeouts)
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(move |push: PushInfo| -> Result<(), ()> {
                callback.handle(push);
                Ok(())
            })
            .build()?;
        let conn = client.get_async_connection().await?;
        self.channels.link_up(epoch);
        let ender = EndOnDrop(pushes.clone());
        let watcher = tokio::spawn(async move {
            let _ender = ender;
            std::future::pending::<()>().await;
        });
        *link = Some(Link {
            conn: conn.clone(),
            epoch,
            pushes,
            watcher: watcher.abort_handle(),
        });
        Ok((conn, epoch))
    }

    /// Unsubscribes from `channel` on the live link, unless a waiter came back for it.
    ///
    /// # Cancel safety
    /// Never dropped by a caller.
    /// Runs as a task of its own (spawned by the idle hook), never dropped by a caller. An
    /// SUNSUBSCRIBE not answered within the response timeout is given up on; it may still run.
    async fn unsubscribe(&self, channel: String) {
        let link = self.link.lock().await;
        // A waiter may have come back for the channel since its last one left.
        if self.channels.is_watched(&channel) {
            return;
        }
        if let Some(current) = link.as_ref().filter(|current| current.is_alive()) {
            let mut conn = current.conn.clone();
            let _ = tokio::time::timeout(self.timeouts.response, conn.sunsubscribe(&channel)).await;
        }
    }

    /// What the channel's last local waiter calls on leaving: an SUNSUBSCRIBE in the background.
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

impl Drop for ShardedSubscriber {
    /// The link's watcher task ends with the backend.
    fn drop(&mut self) {
        if let Some(link) = self.link.get_mut().take() {
            link.watcher.abort();
        }
    }
}

/// The server's pushes on one link, handled where they arrive (without blocking).
struct Pushes {
    channels: Arc<Channels>,
    epoch: u64,
    alive: Arc<AtomicBool>,
}

impl Pushes {
    fn handle(&self, push: PushInfo) {
        match push.kind {
            PushKind::SMessage => {
                if let Some(channel) = push.data.first().and_then(channel_name) {
                    let payload = match push.data.get(1) {
                        Some(redis::Value::BulkString(bytes)) => bytes.as_slice(),
                        _ => &[],
                    };
                    self.channels.deliver(&channel, payload);
                }
            }
            // A node dropped a subscription a waiter still needs (its slot moved, its master was
            // demoted), or a connection broke: end the link.
            PushKind::SUnsubscribe => {
                let still_needed = push
                    .data
                    .first()
                    .and_then(channel_name)
                    .is_some_and(|channel| self.channels.is_watched(&channel));
                if still_needed {
                    self.end();
                }
            }
            PushKind::Disconnection => self.end(),
            _ => {}
        }
    }

    fn end(&self) {
        if self.alive.swap(false, Ordering::AcqRel) {
            self.channels.link_lost(self.epoch);
        }
    }
}

/// Ends its link when dropped: held by a task of the link's runtime, so a runtime that shuts
/// down (and takes the connection's tasks with it) ends the link.
struct EndOnDrop(Arc<Pushes>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.end();
    }
}

fn channel_name(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}
