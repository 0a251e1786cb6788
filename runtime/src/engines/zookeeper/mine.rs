//! The entries this process made, each with the session that made it and the end of its
//! lease: ZooKeeper deletes an entry only with its session, so this process deletes one whose
//! lease ran out unrenewed, as a lease ends on the other stores.
//!
//! Every entry this process may have made is known here until it is confirmed gone: one made,
//! one whose create lost its reply (unsure until it is looked for), one whose lease ended
//! (lapsed: marked before its delete is sent, so no renewal answered after that counts), a
//! second one of the same owner (a stray, made by a create sent again). A delete that fails is
//! sent again each time the session reconnects, until the entry is gone or the session ended
//! (which takes the entry with it): no entry outlives its lease by more than the outage.

use super::client::Connection;
use super::nodes;
use crate::engines::engine::EngineResult;
use crate::lock::owner::Owner;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use zookeeper_client as zk;

/// The longest wait between two deletes of the same entry when the session does not say it
/// reconnected.
const RETRY_AT_MOST: Duration = Duration::from_secs(2);

/// An entry this process made.
#[derive(Debug, Clone)]
pub(crate) struct Mine {
    pub(crate) path: String,
    /// The session that made it (it goes with that session).
    pub(crate) session: zk::SessionId,
    /// Its creation zxid: the fencing token.
    pub(crate) token: u64,
}

impl Mine {
    pub(crate) fn new(path: String, session: zk::SessionId, czxid: i64) -> Mine {
        Mine {
            path,
            session,
            token: czxid as u64,
        }
    }
}

/// One entry's state.
struct Slot {
    /// The queue it is in.
    queue: String,
    /// `None` while a create's outcome is unknown.
    mine: Option<Mine>,
    /// The session its create was sent on.
    session: zk::SessionId,
    ttl: Duration,
    deadline: Instant,
    /// Which lease this is: a lease started again gets a new one.
    lease: u64,
    expiry: AbortHandle,
    /// Its lease ended: it is being deleted.
    lapsed: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.lapsed {
            self.expiry.abort();
        }
    }
}

/// An entry: its queue's key and its owner.
type Id = (String, String);

#[derive(Default)]
struct State {
    slots: HashMap<Id, Slot>,
    leases: u64,
}

pub(crate) struct Mines {
    connection: Arc<Connection>,
    state: Arc<Mutex<State>>,
}

impl Mines {
    pub(crate) fn new(connection: Arc<Connection>) -> Mines {
        Mines {
            connection,
            state: Arc::default(),
        }
    }

    /// `None`: no live entry of `owner` in `key`'s queue is known; `Some(None)`: one may have
    /// been made by a create whose reply was lost.
    pub(crate) fn get(&self, key: &str, owner: &Owner) -> Option<Option<Mine>> {
        let state = self.lock();
        let slot = state.slots.get(&id(key, owner))?;
        (!slot.lapsed).then(|| slot.mine.clone())
    }

    /// Marks a create of `owner`'s entry in `queue` on `session` as on its way (unsure until it
    /// answers); deleted `ttl` from now unless it is found and renewed by then.
    pub(crate) fn unsure(
        &self,
        key: &str,
        owner: &Owner,
        queue: &str,
        session: zk::SessionId,
        ttl: Duration,
    ) {
        let slot = |lease, expiry| Slot {
            queue: queue.to_owned(),
            mine: None,
            session,
            ttl,
            deadline: Instant::now() + ttl,
            lease,
            expiry,
            lapsed: false,
        };
        self.start(id(key, owner), ttl, slot);
    }

    /// Knows `mine` in `queue`, just made or found: its lease ends `ttl` from now (`None`:
    /// the one it had), and it is deleted then unless renewed.
    pub(crate) fn put(
        &self,
        key: &str,
        owner: &Owner,
        queue: &str,
        mine: Mine,
        ttl: Option<Duration>,
    ) {
        let id = id(key, owner);
        let ttl = ttl.or_else(|| self.lock().slots.get(&id).map(|slot| slot.ttl));
        let Some(ttl) = ttl else { return };
        let slot = |lease, expiry| Slot {
            queue: queue.to_owned(),
            session: mine.session,
            mine: Some(mine),
            ttl,
            deadline: Instant::now() + ttl,
            lease,
            expiry,
            lapsed: false,
        };
        self.start(id, ttl, slot);
    }

    /// Replaces `id`'s slot with `slot(lease, expiry)`, whose lease ends `ttl` from now. A
    /// slot it replaces whose lease had ended keeps being deleted.
    fn start(&self, id: Id, ttl: Duration, slot: impl FnOnce(u64, AbortHandle) -> Slot) {
        let mut state = self.lock();
        state.leases += 1;
        let lease = state.leases;
        let expiry = self.expiry(id.clone(), lease, ttl);
        state.slots.insert(id, slot(lease, expiry));
    }

    /// Starts the lease of `mine`, known and not lapsed, again: `ttl` from now. `false` when
    /// it lapsed (or was left) meanwhile: its renewal does not count.
    pub(crate) fn renewed(&self, key: &str, owner: &Owner, mine: &Mine, ttl: Duration) -> bool {
        let id = id(key, owner);
        let mut state = self.lock();
        state.leases += 1;
        let lease = state.leases;
        let Some(slot) = state.slots.get_mut(&id).filter(|slot| {
            !slot.lapsed
                && slot
                    .mine
                    .as_ref()
                    .is_some_and(|known| known.path == mine.path)
        }) else {
            return false;
        };
        slot.expiry.abort();
        slot.expiry = self.expiry(id, lease, ttl);
        (slot.ttl, slot.deadline, slot.lease) = (ttl, Instant::now() + ttl, lease);
        true
    }

    /// The task that deletes `id`'s entry once lease `lease` has run `ttl`.
    fn expiry(&self, id: Id, lease: u64, ttl: Duration) -> AbortHandle {
        let (connection, state) = (self.connection.clone(), self.state.clone());
        let deadline = Instant::now() + ttl;
        tokio::spawn(async move {
            tokio::time::sleep_until(deadline).await;
            let entry = {
                let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
                let Some(slot) = state.slots.get_mut(&id).filter(|s| s.lease == lease) else {
                    return;
                };
                // Before the delete is sent: no renewal answered from now on counts.
                slot.lapsed = true;
                (slot.queue.clone(), slot.mine.clone(), slot.session)
            };
            let (queue, mine, session) = entry;
            let path = mine.map(|mine| mine.path);
            remove(&connection, &queue, &id.1, path, session).await;
            let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
            if state.slots.get(&id).is_some_and(|slot| slot.lease == lease) {
                state.slots.remove(&id);
            }
        })
        .abort_handle()
    }

    /// Forgets `owner`'s entry in `key`'s queue (deleted, or found gone). One whose lease
    /// ended is left to its delete.
    pub(crate) fn forget(&self, key: &str, owner: &Owner) {
        let mut state = self.lock();
        let id = id(key, owner);
        if state.slots.get(&id).is_some_and(|slot| !slot.lapsed) {
            state.slots.remove(&id);
        }
    }

    /// Forgets `owner`'s entry in `key`'s queue if it is the one at `path`.
    pub(crate) fn forget_path(&self, key: &str, owner: &str, path: &str) {
        let mut state = self.lock();
        let id = (key.to_owned(), owner.to_owned());
        let at_path = state.slots.get(&id).is_some_and(|slot| {
            !slot.lapsed && slot.mine.as_ref().is_some_and(|mine| mine.path == path)
        });
        if at_path {
            state.slots.remove(&id);
        }
    }

    /// How long until `owner`'s entry in `key`'s queue is deleted unless renewed.
    pub(crate) fn time_left(&self, key: &str, owner: &str) -> Option<Duration> {
        let state = self.lock();
        let slot = state.slots.get(&(key.to_owned(), owner.to_owned()))?;
        (!slot.lapsed).then(|| slot.deadline.saturating_duration_since(Instant::now()))
    }

    /// Deletes a second entry of an owner that already has one (made by a create that was
    /// sent again), in the background, until it is gone or its session ended.
    pub(crate) fn delete_stray(&self, path: String, session: zk::SessionId) {
        let connection = self.connection.clone();
        tokio::spawn(async move {
            remove(&connection, "", "", Some(path), session).await;
        });
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn id(key: &str, owner: &Owner) -> Id {
    (key.to_owned(), owner.as_str().to_owned())
}

/// `owner`'s entry in `queue` made on `client`'s session, if a create whose reply was lost
/// made it: after a `sync`, a child with the owner's name whose ephemeral owner is the session.
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub(crate) async fn find(
    connection: &Connection,
    client: &zk::Client,
    queue: &str,
    owner: &str,
) -> EngineResult<Option<Mine>> {
    let children = connection
        .within(async {
            client.sync(queue).await?;
            match client.list_children(queue).await {
                Err(zk::Error::NoNode) => Ok(Vec::new()),
                children => children,
            }
        })
        .await?;
    for name in children {
        if nodes::parse(&name).is_none_or(|n| n.owner != owner) {
            continue;
        }
        let path = format!("{queue}/{name}");
        let stat = connection.within(client.check_stat(&path)).await?;
        let Some(stat) = stat.filter(|s| s.ephemeral_owner == client.session_id().0) else {
            continue;
        };
        return Ok(Some(Mine::new(path, client.session_id(), stat.czxid)));
    }
    Ok(None)
}

/// Deletes `owner`'s entry in `queue` made on `session` (at `path`, else looked for), sending
/// the delete again each time the session reconnects, until the entry is gone or the session
/// ended.
///
/// # Cancel safety
/// Cancel safe: a delete sent may be applied, which is its purpose. It runs in tasks of its
/// own (an entry's expiry, a stray's delete), which nothing drops midway.
async fn remove(
    connection: &Connection,
    queue: &str,
    owner: &str,
    path: Option<String>,
    session: zk::SessionId,
) {
    let mut wait = Duration::from_millis(50);
    loop {
        // A new session is made only once the old one ended, and the entry with it.
        let client = match connection.client().await {
            Ok(client) if client.session_id() == session => client,
            _ => return,
        };
        let path = match &path {
            Some(path) => Ok(Some(path.clone())),
            None => find(connection, &client, queue, owner)
                .await
                .map(|found| found.map(|mine| mine.path)),
        };
        let deleted = match path {
            Ok(None) => return,
            Ok(Some(path)) => connection.within(client.delete(&path, None)).await,
            Err(failure) => Err(failure),
        };
        match deleted {
            Ok(()) => return,
            Err(failure) if super::client::no_node(&failure) => return,
            Err(failure) => tracing::debug!(
                target: "distlock::zookeeper",
                error = %failure.source,
                "an entry past its lease is deleted again once the session reconnects"
            ),
        }
        // Sent again at the next change of the session's state, or after a while.
        let mut states = client.state_watcher();
        let _ = tokio::time::timeout(wait, states.changed()).await;
        wait = (wait * 2).min(RETRY_AT_MOST);
    }
}
