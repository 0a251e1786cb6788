//! Waking waiters without notifications: MySQL tells no change to another connection, but a
//! session blocked in `GET_LOCK` on a name another session holds is woken the moment that
//! session releases it or ends. Each entry of a queue is present by such a name
//! (`presence.rs`); a waiter of this process watches the names of the entries whose going may
//! let it hold — a writer its predecessor, a reader the nearest writer ahead, a permit the
//! holders ahead — each on a connection of its own, blocked in the server.
//!
//! When a name is found free, its entry's deletion is told to the queue engine's watch (which
//! wakes the waiter that waits for it), and the name is not watched again for that queue: an
//! entry whose presence ended with its connection while the entry lives on (a holder cut off
//! from the server, say) wakes its waiters once, early; they find it still there and wait on
//! their timers, never longer than the time the holder has left.
//!
//! A watch blocks for at most [`WATCH_FOR`] at a time and then looks again, so a connection is
//! never left blocked for a waiter that went away; the server's `GET_LOCK` is not cancelled
//! midway, which would leave the connection's state unknown.

use super::presence;
use crate::engines::engine::EngineFailure;
use crate::engines::queue::store::{Deletion, Deletions};
use crate::engines::sql::connection::Connection;
use futures_util::StreamExt;
use sqlx::mysql::MySql;
use sqlx::{AssertSqlSafe, Row};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::mpsc;

/// The longest one blocked `GET_LOCK` waits before it looks whether anyone still waits.
const WATCH_FOR: Duration = Duration::from_secs(5);

/// The watches of one queue.
struct Queue {
    /// Which following of the queue this is (a queue followed anew gets a new one).
    id: u64,
    /// The only sender of the queue's stream: it ends when this goes.
    deletions: mpsc::UnboundedSender<Deletion>,
    /// Owners whose presence is being watched.
    watching: HashSet<String>,
    /// Owners whose presence was found free: not watched again.
    found_free: HashSet<String>,
}

pub(crate) struct Wakes {
    /// The connections the watches block on: their own pool, apart from the requests'.
    connection: Arc<Connection<MySql>>,
    queues: Arc<Mutex<HashMap<String, Queue>>>,
    /// The store's order of deletions told: a read placed at this value happened before every
    /// deletion told later.
    told: Arc<AtomicU64>,
    /// The last [`Queue::id`] given.
    followed: AtomicU64,
}

impl Wakes {
    pub(crate) fn new(connection: Connection<MySql>) -> Wakes {
        Wakes {
            connection: Arc::new(connection),
            queues: Arc::default(),
            told: Arc::default(),
            followed: AtomicU64::new(0),
        }
    }

    /// Where a read that starts now is in the order of deletions told.
    pub(crate) fn now(&self) -> u64 {
        self.told.load(Ordering::SeqCst)
    }

    /// The deletions told in the queue `lock` from now on, until the watch breaks.
    pub(crate) fn follow(&self, lock: &str) -> Deletions {
        let (deletions, mut told) = mpsc::unbounded_channel();
        let mut queues = lock_map(&self.queues);
        queues.retain(|_, queue| !queue.deletions.is_closed());
        queues.insert(
            lock.to_owned(),
            Queue {
                id: self.followed.fetch_add(1, Ordering::Relaxed) + 1,
                deletions,
                watching: HashSet::new(),
                found_free: HashSet::new(),
            },
        );
        futures_util::stream::poll_fn(move |cx| told.poll_recv(cx)).boxed()
    }

    /// Watches the presences of `entries` (owner, token) in the queue `lock` of the lock
    /// database `schema`, where this process follows the queue.
    pub(crate) fn watch(&self, lock: &str, schema: &str, entries: &[(&str, u64)]) {
        let mut queues = lock_map(&self.queues);
        let Some(queue) = queues.get_mut(lock) else {
            return;
        };
        for (owner, token) in entries {
            if queue.watching.contains(*owner) || queue.found_free.contains(*owner) {
                continue;
            }
            queue.watching.insert((*owner).to_owned());
            let watch = Watch {
                connection: self.connection.clone(),
                queues: self.queues.clone(),
                told: self.told.clone(),
                lock: lock.to_owned(),
                queue: queue.id,
                owner: (*owner).to_owned(),
                name: presence::name(schema, *token),
            };
            tokio::spawn(watch.run());
        }
    }
}

/// One presence watched.
struct Watch {
    connection: Arc<Connection<MySql>>,
    queues: Arc<Mutex<HashMap<String, Queue>>>,
    told: Arc<AtomicU64>,
    lock: String,
    /// The [`Queue::id`] of the following it watches for.
    queue: u64,
    owner: String,
    name: String,
}

impl Watch {
    /// Blocks on the presence until it is free (told as the entry's deletion), nobody follows
    /// the queue any more, or the watch fails (the queue's watch then ends: its waiters look
    /// again, and watch anew).
    async fn run(self) {
        let sql = format!(
            "SELECT CAST(COALESCE(GET_LOCK({n}, {s}), 0) AS SIGNED), RELEASE_LOCK({n})",
            n = self.name,
            s = WATCH_FOR.as_secs()
        );
        let pool = self.connection.pool();
        let free = loop {
            if !self.followed() {
                break None;
            }
            let reply = self
                .connection
                .call_blocking(WATCH_FOR, "", async {
                    let row = sqlx::raw_sql(AssertSqlSafe(sql.as_str()))
                        .fetch_one(pool)
                        .await?;
                    row.try_get::<i64, _>(0)
                })
                .await;
            match reply {
                Ok(1) => break Some(true),
                Ok(_) => continue,
                Err(failure) => break Some(self.failed(&failure)),
            }
        };
        self.end(free);
    }

    /// Whether this process still follows the queue, as it did when the watch started.
    fn followed(&self) -> bool {
        lock_map(&self.queues)
            .get(&self.lock)
            .is_some_and(|queue| queue.id == self.queue && !queue.deletions.is_closed())
    }

    /// The watch failed: said, and `false`.
    fn failed(&self, failure: &EngineFailure) -> bool {
        tracing::debug!(
            target: "distlock::wait",
            database = self.connection.describe(),
            queue = self.lock,
            error = %failure.source,
            "a presence watch failed; the queue's waiters look again"
        );
        false
    }

    /// `free`: the presence was found free (`Some(true)`), the watch failed (`Some(false)`),
    /// or nobody follows the queue any more (`None`).
    fn end(self, free: Option<bool>) {
        let mut queues = lock_map(&self.queues);
        let Some(queue) = queues.get_mut(&self.lock) else {
            return;
        };
        if queue.id != self.queue {
            return;
        }
        queue.watching.remove(&self.owner);
        match free {
            Some(true) => {
                queue.found_free.insert(self.owner.clone());
                let at = self.told.fetch_add(1, Ordering::SeqCst) + 1;
                let _ = queue.deletions.send(Deletion {
                    owner: self.owner,
                    at,
                });
            }
            // The queue's stream ends with its sender: its waiters look again.
            Some(false) => {
                queues.remove(&self.lock);
            }
            None => {}
        }
    }
}

fn lock_map<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
