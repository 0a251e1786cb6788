//! The store's one listening connection: `LISTEN <schema>`, and the changes its notifications
//! tell, routed to whoever follows the key they are about.
//!
//! A link is opened when a key is first watched, and is in force once `LISTEN` is answered and a
//! probe notification sent through the pool has come back on it; then every change committed
//! after that point reaches it. When the connection breaks, every stream of the link ends (the
//! queue engine's waiters then ask again), and the next watch opens a new link. Where the probe
//! does not come back — a transaction-mode pooler between the client and the database, which
//! hands the `LISTEN` to a server connection nobody listens on — notifications cannot work:
//! that is said once in the log, watches fail as a transient failure (the waiters poll, with
//! jittered backoff), and a link is tried again a minute later.

use super::client::Connection;
use super::sql::{render, Arg};
use crate::engines::engine::{EngineFailure, EngineResult};
use crate::lock::owner::Owner;
use sqlx::postgres::PgListener;
use sqlx::AssertSqlSafe;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How long a link found unable to carry notifications is not tried again.
const UNAVAILABLE_FOR: Duration = Duration::from_secs(60);

/// One change a notification told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    pub(crate) op: Op,
    pub(crate) key: String,
    pub(crate) owner: String,
    /// The changing transaction's id.
    pub(crate) xid: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Joined,
    Renewed,
    Deleted,
}

impl Change {
    /// `op \t key \t owner \t xid`, as `told` writes it.
    fn parse(payload: &str) -> Option<Change> {
        let mut fields = payload.split('\t');
        let op = match fields.next()? {
            "j" => Op::Joined,
            "r" => Op::Renewed,
            "d" => Op::Deleted,
            _ => return None,
        };
        Some(Change {
            op,
            key: fields.next()?.to_owned(),
            owner: fields.next()?.to_owned(),
            xid: fields.next()?.parse().ok()?,
        })
    }
}

/// The changes of one key, until the link breaks.
pub(crate) type Changes = mpsc::UnboundedReceiver<Change>;

/// The routes of a link, by key, and how many keys there were when they were last pruned.
#[derive(Default)]
struct Routes {
    by_key: HashMap<String, Vec<mpsc::UnboundedSender<Change>>>,
    pruned_at: usize,
}

impl Routes {
    /// Drops the routes nobody follows any more, once the table has doubled since the last
    /// time (amortised: a key followed once and never changed again does not stay for ever).
    fn prune(&mut self) {
        if self.by_key.len() < (2 * self.pruned_at).max(64) {
            return;
        }
        self.by_key.retain(|_, senders| {
            senders.retain(|sender| !sender.is_closed());
            !senders.is_empty()
        });
        self.pruned_at = self.by_key.len();
    }
}

pub(crate) struct Listener {
    shared: Arc<Shared>,
}

struct Shared {
    connection: Arc<Connection>,
    schema: String,
    /// The live link's routes by key; `None` while no link is up.
    live: Arc<Mutex<Option<Routes>>>,
    /// Held while a link is being opened, so that one opens at a time.
    opening: tokio::sync::Mutex<()>,
    reader: Mutex<Option<tokio::task::AbortHandle>>,
    /// Until when notifications are taken as unavailable (a pooler), and whether that was said.
    unavailable_until: Mutex<Option<Instant>>,
    warned: AtomicBool,
    /// Set when the backend shut down: no link is opened any more.
    closed: AtomicBool,
}

impl Listener {
    pub(crate) fn new(connection: Arc<Connection>, schema: &str) -> Listener {
        Listener {
            shared: Arc::new(Shared {
                connection,
                schema: schema.to_owned(),
                live: Arc::default(),
                opening: tokio::sync::Mutex::new(()),
                reader: Mutex::new(None),
                unavailable_until: Mutex::new(None),
                warned: AtomicBool::new(false),
                closed: AtomicBool::new(false),
            }),
        }
    }

    /// The changes of `key` (the lock's full name) from now on, on a link in force.
    ///
    /// # Errors
    /// An ambiguous failure when no link can be had now: the connection failed, or
    /// notifications do not reach this client (a transaction-mode pooler).
    ///
    /// # Cancel safety
    /// Cancel safe: a link is opened by a task of its own, which a dropped call leaves to
    /// finish — what it finds (a link, or that none can be had) serves the next call — and no
    /// route is left for the dropped one.
    pub(crate) async fn follow(&self, key: &str) -> EngineResult<Changes> {
        if let Some(changes) = self.shared.route(key) {
            return Ok(changes);
        }
        let shared = self.shared.clone();
        tokio::spawn(async move { shared.open_once().await })
            .await
            .map_err(EngineFailure::ambiguous)??;
        self.shared
            .route(key)
            .ok_or_else(|| EngineFailure::ambiguous("the notification link broke at once"))
    }

    /// Ends the link (the backend shut down).
    pub(crate) fn close(&self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        if let Some(task) = lock(&self.shared.reader).take() {
            task.abort();
        }
        lock(&self.shared.live).take();
    }
}

impl Shared {
    /// A route for `key` on the live link, if one is up.
    fn route(&self, key: &str) -> Option<Changes> {
        let mut live = lock(&self.live);
        let routes = live.as_mut()?;
        routes.prune();
        let (sender, changes) = mpsc::unbounded_channel();
        let senders = routes.by_key.entry(key.to_owned()).or_default();
        senders.retain(|sender| !sender.is_closed());
        senders.push(sender);
        Some(changes)
    }

    /// A link up when this returns `Ok`: the live one, or one opened now — unless
    /// notifications were found unavailable lately, or the backend shut down.
    async fn open_once(&self) -> EngineResult<()> {
        let _opening = self.opening.lock().await;
        if lock(&self.live).is_some() {
            return Ok(());
        }
        if self.closed.load(Ordering::SeqCst) {
            return Err(EngineFailure::ambiguous("the backend shut down"));
        }
        let until = *lock(&self.unavailable_until);
        if until.is_some_and(|until| Instant::now() < until) {
            return Err(EngineFailure::ambiguous(
                "PostgreSQL's notifications do not reach this client; waiters poll",
            ));
        }
        self.open().await
    }

    /// Opens a link: `LISTEN`, then a probe through the pool that must come back on it.
    async fn open(&self) -> EngineResult<()> {
        let pool = self.connection.pool().clone();
        let schema = self.schema.clone();
        let mut listener = self
            .connection
            .call(&schema, async {
                let mut listener = PgListener::connect_with(&pool).await?;
                listener.eager_reconnect(false);
                listener.listen(&schema).await?;
                Ok(listener)
            })
            .await?;
        let probe = format!("p\t{}", Owner::random().as_str());
        self.connection
            .call(&schema, async {
                let notify = render(
                    "SELECT pg_notify($1, $2)",
                    &[Arg::Text(&schema), Arg::Text(&probe)],
                );
                sqlx::raw_sql(AssertSqlSafe(notify)).execute(&pool).await
            })
            .await?;
        if !came_back(&mut listener, &probe).await {
            *lock(&self.unavailable_until) = Some(Instant::now() + UNAVAILABLE_FOR);
            self.warn_unavailable();
            return Err(EngineFailure::ambiguous(
                "PostgreSQL's notifications do not reach this client; waiters poll",
            ));
        }
        *lock(&self.live) = Some(Routes::default());
        let task = tokio::spawn(read(listener, self.live.clone(), self.schema.clone()));
        if let Some(old) = lock(&self.reader).replace(task.abort_handle()) {
            old.abort();
        }
        Ok(())
    }

    fn warn_unavailable(&self) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                target: "distlock::wait",
                database = self.connection.describe(),
                "LISTEN/NOTIFY does not reach this client (a transaction-mode pooler between \
                 it and the database?): waiters poll with jittered backoff instead of being \
                 woken; connect the backend to the database or a session-mode pool to have \
                 them woken"
            );
        }
    }
}

/// Whether the probe `payload` arrives on `listener` within a second.
async fn came_back(listener: &mut PgListener, payload: &str) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        match tokio::time::timeout_at(deadline, listener.try_recv()).await {
            Ok(Ok(Some(notification))) if notification.payload() == payload => return true,
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None) | Err(_)) | Err(_) => return false,
        }
    }
}

/// Routes the link's notifications until it breaks; then every route ends.
async fn read(mut listener: PgListener, live: Arc<Mutex<Option<Routes>>>, schema: String) {
    while let Ok(Some(notification)) = listener.try_recv().await {
        let Some(change) = Change::parse(notification.payload()) else {
            continue;
        };
        let mut live = lock(&live);
        let Some(routes) = live.as_mut() else { return };
        if let Some(senders) = routes.by_key.get_mut(&change.key) {
            senders.retain(|sender| sender.send(change.clone()).is_ok());
            if senders.is_empty() {
                routes.by_key.remove(&change.key);
            }
        }
    }
    tracing::debug!(target: "distlock::wait", schema, "the PostgreSQL notification link ended");
    lock(&live).take();
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notification_tells_one_change() {
        assert_eq!(
            Change::parse("d\tdistlock:{order:7}\tab12\t7311"),
            Some(Change {
                op: Op::Deleted,
                key: "distlock:{order:7}".into(),
                owner: "ab12".into(),
                xid: 7311,
            })
        );
        assert_eq!(Change::parse("p\tprobe"), None);
        assert_eq!(Change::parse("x\tk\to\t1"), None);
    }
}
