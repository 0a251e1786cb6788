//! The entries this process made, each with the session that made it and the end of its
//! lease: an entry nobody renewed is deleted once its TTL has passed, as a lease ends on the
//! other stores (ZooKeeper itself deletes it only with its session).
//!
//! An entry whose create lost its reply is marked unsure until it is looked for; a leave that
//! could not be confirmed keeps the entry known, so a later leave deletes it. An entry whose
//! lease ended is marked lapsed before its delete is sent: no renewal answered after that
//! counts, and a delete that failed is left to the entry's leave.

use super::client::Connection;
use crate::lock::owner::Owner;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use zookeeper_client as zk;

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

/// One entry's state: `mine` is `None` while a create's outcome is unknown.
struct Slot {
    mine: Option<Mine>,
    deadline: Option<Instant>,
    expiry: Option<AbortHandle>,
    /// Its lease ended: it is being deleted, or its delete failed.
    lapsed: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(expiry) = self.expiry.take() {
            expiry.abort();
        }
    }
}

type Slots = HashMap<(String, String), Slot>;

pub(crate) struct Mines {
    connection: Arc<Connection>,
    slots: Arc<Mutex<Slots>>,
}

impl Mines {
    pub(crate) fn new(connection: Arc<Connection>) -> Mines {
        Mines {
            connection,
            slots: Arc::default(),
        }
    }

    /// `None`: no entry of `owner` in `key`'s queue is known; `Some(None)`: one may have been
    /// made by a create whose reply was lost.
    pub(crate) fn get(&self, key: &str, owner: &Owner) -> Option<Option<Mine>> {
        let slots = self.lock();
        let slot = slots.get(&(key.to_owned(), owner.as_str().to_owned()))?;
        (!slot.lapsed).then(|| slot.mine.clone())
    }

    /// The path of `owner`'s entry in `key`'s queue if its lease ended and its delete has not
    /// been confirmed.
    pub(crate) fn lapsed(&self, key: &str, owner: &Owner) -> Option<String> {
        let slots = self.lock();
        let slot = slots.get(&(key.to_owned(), owner.as_str().to_owned()))?;
        slot.mine
            .as_ref()
            .filter(|_| slot.lapsed)
            .map(|mine| mine.path.clone())
    }

    /// Marks a create of `owner`'s entry as on its way (unsure until it answers).
    pub(crate) fn unsure(&self, key: &str, owner: &Owner) {
        self.lock().insert(
            (key.to_owned(), owner.as_str().to_owned()),
            Slot {
                mine: None,
                deadline: None,
                expiry: None,
                lapsed: false,
            },
        );
    }

    /// Knows `mine`, just made or found; with `ttl`, its lease ends `ttl` from now, and it is
    /// deleted then unless renewed.
    pub(crate) fn put(&self, key: &str, owner: &Owner, mine: Mine, ttl: Option<Duration>) {
        let id = (key.to_owned(), owner.as_str().to_owned());
        let mut slots = self.lock();
        let (deadline, expiry) = match ttl {
            Some(ttl) => self.lease(&id, &mine.path, ttl),
            None => (None, None),
        };
        slots.insert(
            id,
            Slot {
                mine: Some(mine),
                deadline,
                expiry,
                lapsed: false,
            },
        );
    }

    /// Starts the lease of `mine`, known and not lapsed, again: `ttl` from now. `false` when
    /// it lapsed (or was left) meanwhile: its renewal does not count.
    pub(crate) fn renewed(&self, key: &str, owner: &Owner, mine: &Mine, ttl: Duration) -> bool {
        let id = (key.to_owned(), owner.as_str().to_owned());
        let mut slots = self.lock();
        let Some(slot) = slots.get_mut(&id).filter(|slot| {
            !slot.lapsed
                && slot
                    .mine
                    .as_ref()
                    .is_some_and(|known| known.path == mine.path)
        }) else {
            return false;
        };
        let (deadline, expiry) = self.lease(&id, &mine.path, ttl);
        if let Some(old) = std::mem::replace(&mut slot.expiry, expiry) {
            old.abort();
        }
        slot.deadline = deadline;
        true
    }

    /// A lease of `ttl` from now for the entry at `path`: its end, and the task that deletes
    /// the entry then.
    fn lease(
        &self,
        id: &(String, String),
        path: &str,
        ttl: Duration,
    ) -> (Option<Instant>, Option<AbortHandle>) {
        let deadline = Instant::now() + ttl;
        let expiry = tokio::spawn(expire(
            self.connection.clone(),
            self.slots.clone(),
            id.clone(),
            path.to_owned(),
            deadline,
        ));
        (Some(deadline), Some(expiry.abort_handle()))
    }

    /// Forgets `owner`'s entry in `key`'s queue (deleted, or found gone).
    pub(crate) fn forget(&self, key: &str, owner: &Owner) {
        self.lock()
            .remove(&(key.to_owned(), owner.as_str().to_owned()));
    }

    /// Forgets `owner`'s entry in `key`'s queue if it is the one at `path`.
    pub(crate) fn forget_path(&self, key: &str, owner: &str, path: &str) {
        let mut slots = self.lock();
        let id = (key.to_owned(), owner.to_owned());
        if slots
            .get(&id)
            .and_then(|slot| slot.mine.as_ref())
            .is_some_and(|mine| mine.path == path)
        {
            slots.remove(&id);
        }
    }

    /// How long until `owner`'s entry is deleted unless renewed.
    pub(crate) fn time_left(&self, owner: &str) -> Option<Duration> {
        let slots = self.lock();
        let (_, slot) = slots
            .iter()
            .find(|((_, of), slot)| of == owner && !slot.lapsed)?;
        Some(slot.deadline?.saturating_duration_since(Instant::now()))
    }

    /// Writes the entry at `path` again with `data` (its lease and label), through the
    /// leader — which also proves the session alive there — if it is there: whether it was.
    /// The request is sent when this is called.
    pub(crate) fn touch<'c>(
        &self,
        client: &'c zk::Client,
        path: &str,
        data: &[u8],
    ) -> impl Future<Output = Result<bool, zk::Error>> + Send + 'c {
        let written = client.set_data(path, data, None);
        async move {
            match written.await {
                Ok(_) => Ok(true),
                Err(zk::Error::NoNode) => Ok(false),
                Err(err) => Err(err),
            }
        }
    }

    /// Deletes a second entry of an owner that already has one (made by a create that was
    /// sent again), in the background.
    pub(crate) fn delete_stray(&self, path: String) {
        let connection = self.connection.clone();
        tokio::spawn(async move {
            let Ok(client) = connection.client().await else {
                return;
            };
            if let Err(err) = connection.within(client.delete(&path, None)).await {
                tracing::debug!(target: "distlock::zookeeper", error = %err.source, "a stray entry stays until its session ends");
            }
        });
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Deletes the entry at `path` at `deadline` unless it was renewed or left by then.
async fn expire(
    connection: Arc<Connection>,
    slots: Arc<Mutex<Slots>>,
    id: (String, String),
    path: String,
    deadline: Instant,
) {
    tokio::time::sleep_until(deadline).await;
    {
        let mut slots = slots.lock().unwrap_or_else(|e| e.into_inner());
        let current = slots.get_mut(&id);
        let Some(slot) = current.filter(|slot| {
            slot.deadline == Some(deadline) && slot.mine.as_ref().is_some_and(|m| m.path == path)
        }) else {
            return;
        };
        // Before the delete is sent: no renewal answered from now on counts.
        slot.lapsed = true;
        slot.deadline = None;
        // This task is ending: the slot must not abort it.
        slot.expiry = None;
    }
    let deleted = match connection.client().await {
        Ok(client) => connection.within(client.delete(&path, None)).await,
        Err(failure) => Err(failure),
    };
    match deleted {
        Err(failure) if !super::store::no_node(&failure) => tracing::debug!(
            target: "distlock::zookeeper",
            error = %failure.source,
            "a lapsed entry stays until its leave or the end of its session"
        ),
        _ => forget_lapsed(&slots, &id, &path),
    }
}

/// Forgets the entry at `path` once its delete is confirmed, if it is still the lapsed one.
fn forget_lapsed(slots: &Mutex<Slots>, id: &(String, String), path: &str) {
    let mut slots = slots.lock().unwrap_or_else(|e| e.into_inner());
    if slots
        .get(id)
        .is_some_and(|slot| slot.lapsed && slot.mine.as_ref().is_some_and(|m| m.path == path))
    {
        slots.remove(id);
    }
}
