//! The FIFO floor: the least a first-in-first-out handoff through the server can cost, measured
//! beside the libraries in the contended workloads.
//!
//! It is a direct FIFO handoff through the server, stripped to its bare minimum: the
//! waiters queue on the server (a list), and the release pops the holder and publishes a grant to
//! the next waiter's process in the same script, so a handoff is one message. Nothing else is
//! there — no lease (a dead holder blocks the key for good), no fencing token, no ownership check,
//! no cancellation safety, no expiry of dead waiters. No correct lock can hand over in FIFO order
//! through the server for less, so its rate is the ceiling of any such design on this machine,
//! in the same run as rslock.

use futures_util::StreamExt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{oneshot, OnceCell};

/// Joins the key's queue; 1 when the caller is first in it (it holds the lock).
const ENQUEUE: &str = "return redis.call('RPUSH', KEYS[1], ARGV[1])";

/// Leaves the head of the queue and grants the lock to the next waiter: a message on the
/// channel of its client (`fifo-floor:<client id>`), carrying its ticket.
const RELEASE: &str = r"
redis.call('LPOP', KEYS[1])
local next = redis.call('LINDEX', KEYS[1], 0)
if next then
  redis.call('PUBLISH', 'fifo-floor:' .. string.match(next, '^(.*):'), next)
end
return 1
";

/// One process's client: one command connection, one subscription for its grants.
pub(crate) struct FifoFloor {
    client: redis::Client,
    /// `<id>:<ticket>` names a waiter; the id names this client's grant channel.
    id: String,
    next_ticket: AtomicU64,
    /// Waiters whose grant has not come yet, by ticket.
    waiters: Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>>,
    connection: OnceCell<redis::aio::MultiplexedConnection>,
    enqueue: redis::Script,
    release: redis::Script,
}

/// A held FIFO-floor lock: its queue and the ticket at its head.
pub(crate) struct FloorHeld {
    queue: String,
    ticket: String,
}

impl FifoFloor {
    pub(crate) fn new(url: &str) -> Result<FifoFloor, String> {
        let client = redis::Client::open(url).map_err(|err| format!("fifo-floor: {err}"))?;
        let id = format!(
            "{}-{:x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |t| t.as_nanos())
        );
        Ok(FifoFloor {
            client,
            id,
            next_ticket: AtomicU64::new(0),
            waiters: Arc::default(),
            connection: OnceCell::new(),
            enqueue: redis::Script::new(ENQUEUE),
            release: redis::Script::new(RELEASE),
        })
    }

    /// The command connection, opened (with the grant subscription) on first use.
    async fn connection(&self) -> Result<redis::aio::MultiplexedConnection, String> {
        let connection = self
            .connection
            .get_or_try_init(|| async {
                let mut pubsub = self.client.get_async_pubsub().await.map_err(err)?;
                pubsub
                    .subscribe(format!("fifo-floor:{}", self.id))
                    .await
                    .map_err(err)?;
                let waiters = self.waiters.clone();
                tokio::spawn(async move {
                    let mut grants = pubsub.into_on_message();
                    while let Some(grant) = grants.next().await {
                        let ticket: String = grant.get_payload().unwrap_or_default();
                        let ticket = ticket.rsplit(':').next().and_then(|t| t.parse().ok());
                        let waiter = ticket.and_then(|t| lock(&waiters).remove(&t));
                        if let Some(waiter) = waiter {
                            let _ = waiter.send(());
                        }
                    }
                });
                self.client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(err)
            })
            .await?;
        Ok(connection.clone())
    }

    /// Joins `key`'s queue and waits for the grant unless first.
    pub(crate) async fn acquire(&self, key: &str) -> Result<FloorHeld, String> {
        let mut connection = self.connection().await?;
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        // Registered before joining the queue: a grant can come before the reply.
        let (granted, grant) = oneshot::channel();
        lock(&self.waiters).insert(ticket, granted);
        let held = FloorHeld {
            queue: format!("fifo-floor:{key}:q"),
            ticket: format!("{}:{ticket}", self.id),
        };
        let position: i64 = self
            .enqueue
            .key(&held.queue)
            .arg(&held.ticket)
            .invoke_async(&mut connection)
            .await
            .map_err(err)?;
        if position == 1 {
            lock(&self.waiters).remove(&ticket);
        } else {
            grant
                .await
                .map_err(|_| "fifo-floor: the grant listener ended".to_owned())?;
        }
        Ok(held)
    }

    pub(crate) async fn release(&self, held: FloorHeld) -> Result<(), String> {
        let mut connection = self.connection().await?;
        let _: i64 = self
            .release
            .key(&held.queue)
            .invoke_async(&mut connection)
            .await
            .map_err(err)?;
        Ok(())
    }
}

fn err(error: redis::RedisError) -> String {
    format!("fifo-floor: {error}")
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
