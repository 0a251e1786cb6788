//! [`ZkStore`]: the queue engine's [`Store`] on ZooKeeper — each lock's queue a container node,
//! each entry an ephemeral sequential child (`nodes.rs`) whose creation zxid is its fencing
//! token, its waiters woken by watches of the entries ahead (`wakes.rs`).
//!
//! An entry lives as long as the session that made it and, on top of that, as long as its
//! lease: this store deletes an entry nobody renewed once its TTL has passed (`mine.rs`). A
//! lease may last at most three quarters of the session timeout the ensemble granted, so that
//! a holder cut off from the ensemble has seen its lease run out before the ensemble can end
//! its session and delete its entry.

use super::client::{no_node, node_exists, Connection};
use super::mine::{self, Mine, Mines};
use super::nodes::{self, Paths};
use super::wakes::Wakes;
use crate::engines::engine::{EngineFailure, EngineResult, Renewal};
use crate::engines::queue::order::{self, Entry};
use crate::engines::queue::store::{Deletions, Presence, Read, Store};
use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use crate::operating::doctor::Finding;
use crate::operating::key_events::KeyEventSender;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zookeeper_client as zk;

pub(crate) struct ZkStore {
    pub(super) connection: Arc<Connection>,
    pub(super) paths: Paths,
    label: String,
    /// Who may touch the nodes this store makes: anyone, or (with credentials) their user only.
    acls: zk::Acls<'static>,
    pub(super) mines: Arc<Mines>,
    wakes: Arc<Wakes>,
    /// The backend's watchdog lease, which the doctor holds the session against.
    pub(super) watchdog_lease: Duration,
    /// When the last request the leader answered was sent, and on which session: the session
    /// lives at least that long plus its timeout.
    contact: std::sync::Mutex<Option<(zk::SessionId, Instant)>>,
}

impl ZkStore {
    pub(crate) fn new(
        connection: Connection,
        prefix: &str,
        label: &str,
        watchdog_lease: Duration,
    ) -> ZkStore {
        let acls = match connection.spec().username {
            Some(_) => zk::Acls::creator_all(),
            None => zk::Acls::anyone_all(),
        };
        let connection = Arc::new(connection);
        ZkStore {
            mines: Arc::new(Mines::new(connection.clone())),
            connection,
            paths: Paths::new(prefix),
            label: label.to_owned(),
            acls,
            wakes: Arc::default(),
            watchdog_lease,
            contact: std::sync::Mutex::new(None),
        }
    }

    /// Notes that the leader answered a request of `client`'s session sent at `sent`.
    fn contacted(&self, client: &zk::Client, sent: Instant) {
        let mut contact = self.contact.lock().unwrap_or_else(|e| e.into_inner());
        let session = client.session_id();
        if contact.is_none_or(|(known, at)| known != session || at < sent) {
            *contact = Some((session, sent));
        }
    }

    /// Whether a lease of `ttl` from now ends within what `client`'s session is known to
    /// cover already (its last answer from the leader, plus three quarters of its timeout):
    /// then a join that keeps its place needs no word from the leader.
    fn covered(&self, client: &zk::Client, ttl: Duration) -> bool {
        let contact = *self.contact.lock().unwrap_or_else(|e| e.into_inner());
        contact.is_some_and(|(session, at)| {
            session == client.session_id()
                && Instant::now() + ttl <= at + lease_limit(client.session_timeout())
        })
    }

    /// Refuses a lease the session cannot cover: a holder cut off from the ensemble must see
    /// its lease end before the ensemble may end its session.
    fn fits_session(&self, client: &zk::Client, ttl: Duration) -> EngineResult<()> {
        let longest = lease_limit(client.session_timeout());
        if ttl <= longest {
            return Ok(());
        }
        Err(EngineFailure {
            ambiguous: false,
            source: format!(
                "a lease of {} outlives what the ZooKeeper session covers ({}, three quarters \
                 of the {} session timeout the ensemble granted): a holder cut off from the \
                 ensemble could lose its node before its lease ran out; use a shorter lease \
                 (or watchdog_lease), or ask for a longer session with `?session_timeout=` \
                 in the URL (within the ensemble's maxSessionTimeout)",
                humantime::format_duration(ttl),
                humantime::format_duration(longest),
                humantime::format_duration(client.session_timeout()),
            )
            .into(),
        })
    }

    /// Creates `owner`'s entry in `queue` and reads the queue, in one round trip; the queue
    /// (and the prefix's node) are made when missing.
    ///
    /// # Cancel safety
    /// Not cancel safe: the create may be applied. A create whose outcome is unknown is
    /// marked so, and the next join or leave of the entry looks for it first.
    async fn create(
        &self,
        client: &zk::Client,
        key: &str,
        owner: &Owner,
        kind: LockKind,
        ttl: Duration,
    ) -> EngineResult<(Mine, Vec<String>)> {
        let queue = self.paths.queue(key);
        let prefix = nodes::entry_prefix(&queue, owner.as_str(), kind);
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.acls);
        for first in [true, false] {
            self.mines
                .unsure(key, owner, &queue, client.session_id(), ttl);
            let sent = Instant::now();
            let created = client.create(&prefix, &self.data(ttl), &options);
            let children = client.list_children(&queue);
            let (created, children) = self
                .connection
                .within(async { Ok(tokio::join!(created, children)) })
                .await?;
            match (created, children) {
                (Ok((stat, sequence)), Ok(children)) => {
                    self.contacted(client, sent);
                    let path = format!("{prefix}{sequence}");
                    let mine = Mine::new(path, client.session_id(), stat.czxid);
                    return Ok((mine, children));
                }
                (Err(zk::Error::NoNode), _) if first => self.make_queue(client, &queue).await?,
                (Err(err), _) | (_, Err(err)) => return Err(self.connection.failure(err)),
            }
        }
        Err(EngineFailure::ambiguous(
            "the lock's queue node vanished twice while joining it",
        ))
    }

    /// Makes `queue` (a container, which ZooKeeper deletes once empty), and first the
    /// prefix's node when that is missing too.
    ///
    /// # Cancel safety
    /// Not cancel safe: a create sent may be applied; the queue node made is what a later join
    /// makes anyway.
    async fn make_queue(&self, client: &zk::Client, queue: &str) -> EngineResult<()> {
        let container = zk::CreateMode::Container.with_acls(self.acls);
        match self.make(client, queue, &container).await {
            Err(failure) if no_node(&failure) => {
                let root = zk::CreateMode::Persistent.with_acls(self.acls);
                self.make(client, &self.paths.root, &root).await?;
                self.make(client, queue, &container).await
            }
            made => made,
        }
    }

    /// Makes the node at `path` unless it is there.
    ///
    /// # Cancel safety
    /// Not cancel safe: the create may be applied (the node then is there, as asked).
    async fn make(
        &self,
        client: &zk::Client,
        path: &str,
        mode: &zk::CreateOptions<'_>,
    ) -> EngineResult<()> {
        let created = self.connection.within(client.create(path, &[], mode)).await;
        match created {
            Err(failure) if node_exists(&failure) => Ok(()),
            created => created.map(drop),
        }
    }

    /// The children of the node at `path` as the server answering has them (none when it is
    /// gone).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    async fn children(&self, client: &zk::Client, path: &str) -> EngineResult<Vec<String>> {
        match self.connection.within(client.list_children(path)).await {
            Err(failure) if no_node(&failure) => Ok(Vec::new()),
            children => children,
        }
    }

    /// `queue`'s children, read once the server answering has seen everything the leader
    /// committed before (a `sync`, sent with the read: one round trip). That the leader
    /// answered proves the session alive there, as a write would, without writing: what a
    /// join that keeps its place needs (an empty list when the queue is gone).
    ///
    /// # Cancel safety
    /// Cancel safe: a `sync` and a read change nothing.
    async fn read_through_leader(
        &self,
        client: &zk::Client,
        queue: &str,
    ) -> EngineResult<Vec<String>> {
        let sent = Instant::now();
        let synced = client.sync(queue);
        let children = client.list_children(queue);
        let (synced, children) = self
            .connection
            .within(async { Ok(tokio::join!(synced, children)) })
            .await?;
        synced.map_err(|err| self.connection.failure(err))?;
        self.contacted(client, sent);
        match children {
            Ok(children) => Ok(children),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(err) => Err(self.connection.failure(err)),
        }
    }

    /// `owner`'s entry in `key`'s queue as this store knows it on `client`'s session: made by
    /// it, or found after a create whose reply was lost. `None`: there is none.
    ///
    /// # Cancel safety
    /// Cancel safe: it reads, and changes what this store knows only after its answer.
    async fn mine(
        &self,
        client: &zk::Client,
        key: &str,
        owner: &Owner,
    ) -> EngineResult<Option<Mine>> {
        match self.mines.get(key, owner) {
            Some(Some(mine)) if mine.session == client.session_id() => Ok(Some(mine)),
            // Made on a session that has ended: gone with it.
            Some(Some(_)) => Ok(None),
            Some(None) => {
                let queue = self.paths.queue(key);
                let found = mine::find(&self.connection, client, &queue, owner.as_str()).await?;
                match &found {
                    Some(mine) => self.mines.put(key, owner, &queue, mine.clone(), None),
                    None => self.mines.forget(key, owner),
                }
                Ok(found)
            }
            None => Ok(None),
        }
    }

    /// The entries of `key`'s queue in order, from the children's names; `mine`'s token is
    /// known, the others' are not needed (0). Another entry of the same owner (made by a
    /// create whose reply was lost, and made again) is deleted.
    fn entries(
        &self,
        key: &str,
        children: &[String],
        mine: &Mine,
        owner: &Owner,
    ) -> Vec<Entry<i64>> {
        let queue = self.paths.queue(key);
        let mut entries: Vec<Entry<i64>> = Vec::with_capacity(children.len());
        for name in children {
            let Some(parsed) = nodes::parse(name) else {
                continue;
            };
            let path = format!("{queue}/{name}");
            if parsed.owner == owner.as_str() && path != mine.path {
                self.mines.delete_stray(path, mine.session);
                continue;
            }
            entries.push(Entry {
                owner: parsed.owner.to_owned(),
                token: match path == mine.path {
                    true => mine.token,
                    false => 0,
                },
                lease: parsed.sequence,
                kind: parsed.kind,
                label: String::new(),
            });
        }
        entries.sort_by_key(|entry| entry.lease);
        entries
    }

    /// Whether another owner's entry is in `key`'s queue (for an answer that `owner`'s is
    /// gone).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    async fn held(&self, client: &zk::Client, key: &str, owner: &Owner) -> EngineResult<bool> {
        let children = self.children(client, &self.paths.queue(key)).await?;
        Ok(children
            .iter()
            .filter_map(|name| nodes::parse(name))
            .any(|name| name.owner != owner.as_str()))
    }

    /// The path of `entry` in `key`'s queue: from its name when its kind is known, else looked
    /// up among the queue's children.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    async fn path_of(
        &self,
        client: &zk::Client,
        key: &str,
        entry: &Entry<i64>,
    ) -> EngineResult<Option<String>> {
        let queue = self.paths.queue(key);
        if let Some(kind) = entry.kind {
            let name = nodes::entry_name(&entry.owner, kind, entry.lease);
            return Ok(Some(format!("{queue}/{name}")));
        }
        let children = self.children(client, &queue).await?;
        Ok(children
            .into_iter()
            .find(|name| {
                nodes::parse(name)
                    .is_some_and(|n| n.owner == entry.owner && n.sequence == entry.lease)
            })
            .map(|name| format!("{queue}/{name}")))
    }
}

impl ZkStore {
    /// What an entry holds: its lease in milliseconds, a newline, and its holder's label.
    fn data(&self, ttl: Duration) -> Vec<u8> {
        format!("{}\n{}", ttl.as_millis(), self.label).into_bytes()
    }
}

/// An entry's lease and label, as [`ZkStore::data`] wrote them (`None`: no lease written).
fn lease_of(data: &[u8]) -> (Option<Duration>, &str) {
    let text = std::str::from_utf8(data).unwrap_or_default();
    match text.split_once('\n') {
        Some((millis, label)) => (millis.parse().ok().map(Duration::from_millis), label),
        None => (None, text),
    }
}

/// The longest lease a session of `timeout` covers: a quarter of it is kept back for the
/// ensemble's own delays in seeing the session alive (a follower tells the leader of its
/// clients each half tick; a session lasts at least two ticks).
pub(crate) fn lease_limit(timeout: Duration) -> Duration {
    timeout * 3 / 4
}

impl Store for ZkStore {
    /// An entry's sequence number, its place in the queue.
    type Lease = i64;

    async fn join(
        &self,
        key: &str,
        owner: &Owner,
        kind: LockKind,
        ttl: Duration,
    ) -> EngineResult<Read<i64>> {
        let client = self.connection.client().await?;
        self.fits_session(&client, ttl)?;
        let queue = self.paths.queue(key);
        // Before anything is sent: a deletion told after this may be one the read missed.
        let at = self.wakes.now();
        let mut joined = None;
        if let Some(mine) = self.mine(&client, key, owner).await? {
            // Keeps its place: its time starts again if it is still there.
            let children = match self.covered(&client, ttl) {
                true => self.children(&client, &queue).await?,
                false => self.read_through_leader(&client, &queue).await?,
            };
            let present = children
                .iter()
                .any(|name| mine.path.strip_prefix(queue.as_str()) == Some(&format!("/{name}")));
            if present && self.mines.renewed(key, owner, &mine, ttl) {
                joined = Some((mine, children));
            } else if !present {
                self.mines.forget(key, owner);
            }
        }
        let (mine, children) = match joined {
            Some(joined) => joined,
            None => {
                let (mine, children) = self.create(&client, key, owner, kind, ttl).await?;
                self.mines.put(key, owner, &queue, mine.clone(), Some(ttl));
                (mine, children)
            }
        };
        let entries = self.entries(key, &children, &mine, owner);
        Ok(Read { entries, at })
    }

    async fn leave(&self, key: &str, owner: &Owner) -> EngineResult<Presence> {
        let client = self.connection.client().await?;
        let Some(mine) = self.mine(&client, key, owner).await? else {
            // Gone, or past its lease (and being deleted).
            self.mines.forget(key, owner);
            let held = self.held(&client, key, owner).await?;
            return Ok(Presence::Absent { held });
        };
        let deleted = self
            .connection
            .within(client.delete(&mine.path, None))
            .await;
        let present = match deleted {
            Ok(()) => true,
            Err(failure) if no_node(&failure) => false,
            // Kept until the delete is confirmed or the session ended.
            Err(failure) => return Err(failure),
        };
        self.mines.forget(key, owner);
        match present {
            true => Ok(Presence::Present),
            false => Ok(Presence::Absent {
                held: self.held(&client, key, owner).await?,
            }),
        }
    }

    /// One `sync` through the leader, which proves the session alive there, and a read of
    /// each entry after it, sent together: one round trip and no write, however many leases.
    async fn renew(&self, batch: &[Renewal<'_>]) -> EngineResult<Vec<Option<Presence>>> {
        let client = self.connection.client().await?;
        let mut known = Vec::with_capacity(batch.len());
        for renewal in batch {
            let mine = self.mine(&client, renewal.key, renewal.owner).await?;
            if mine.is_some() {
                self.fits_session(&client, renewal.ttl)?;
            }
            known.push(mine);
        }
        let sent = Instant::now();
        let synced = client.sync(&self.paths.root);
        let reads = known.iter().map(|mine| {
            let read = mine.as_ref().map(|mine| client.check_stat(&mine.path));
            async move {
                match read {
                    Some(read) => Some(read.await.map(|stat| stat.is_some())),
                    None => None,
                }
            }
        });
        let reads = futures_util::future::join_all(reads);
        let (synced, read) = self
            .connection
            .within(async { Ok(tokio::join!(synced, reads)) })
            .await?;
        synced.map_err(|err| self.connection.failure(err))?;
        self.contacted(&client, sent);
        let checked = known
            .into_iter()
            .zip(read)
            .map(|(mine, read)| mine.zip(read));
        let mut answers = Vec::with_capacity(batch.len());
        for (renewal, checked) in batch.iter().zip(checked) {
            let present = match checked {
                Some((mine, Ok(true))) => {
                    self.mines
                        .renewed(renewal.key, renewal.owner, &mine, renewal.ttl)
                }
                Some((_, Err(err))) => {
                    // This one could not be told; the others stand.
                    tracing::debug!(
                        target: "distlock::renew",
                        error = %err,
                        "renewal not answered"
                    );
                    answers.push(None);
                    continue;
                }
                Some((_, Ok(false))) => {
                    self.mines.forget(renewal.key, renewal.owner);
                    false
                }
                // Not known, or its lease ended here: gone (a lapsed one is left to its leave).
                None => false,
            };
            answers.push(Some(match present {
                true => Presence::Present,
                false => Presence::Absent {
                    held: self.held(&client, renewal.key, renewal.owner).await?,
                },
            }));
        }
        Ok(answers)
    }

    async fn read(&self, key: &str) -> EngineResult<Vec<Entry<i64>>> {
        let client = self.connection.client().await?;
        let queue = self.paths.queue(key);
        let children = self.children(&client, &queue).await?;
        let names: Vec<(String, nodes::Name<'_>)> = children
            .iter()
            .filter_map(|name| Some((format!("{queue}/{name}"), nodes::parse(name)?)))
            .collect();
        let data =
            futures_util::future::join_all(names.iter().map(|(path, _)| client.get_data(path)));
        let data = self.connection.within(async { Ok(data.await) }).await?;
        let mut entries = Vec::with_capacity(names.len());
        for ((_, name), data) in names.iter().zip(data) {
            let (data, stat) = match data {
                Ok(read) => read,
                // Deleted since the list.
                Err(zk::Error::NoNode) => continue,
                Err(err) => return Err(self.connection.failure(err)),
            };
            let (_, label) = lease_of(&data);
            entries.push(Entry {
                owner: name.owner.to_owned(),
                token: stat.czxid as u64,
                lease: name.sequence,
                kind: name.kind,
                label: label.to_owned(),
            });
        }
        entries.sort_by_key(|entry| entry.lease);
        Ok(entries)
    }

    async fn remove(&self, key: &str, entry: &Entry<i64>) -> EngineResult<bool> {
        let client = self.connection.client().await?;
        let Some(path) = self.path_of(&client, key, entry).await? else {
            return Ok(false);
        };
        match self.connection.within(client.delete(&path, None)).await {
            Ok(()) => {
                self.mines.forget_path(key, &entry.owner, &path);
                Ok(true)
            }
            Err(failure) if no_node(&failure) => Ok(false),
            Err(failure) => Err(failure),
        }
    }

    /// This process's own entries: the time until this store deletes them. Another's: what is
    /// left of its lease from its creation on the server's clock, else (renewed since, by reads
    /// that leave no trace) its whole lease, which it lives at most unless renewed again.
    async fn time_left(&self, key: &str, entry: &Entry<i64>) -> Option<Duration> {
        if let Some(left) = self.mines.time_left(key, &entry.owner) {
            return Some(left);
        }
        let client = self.connection.client().await.ok()?;
        let path = self.path_of(&client, key, entry).await.ok()??;
        let (data, stat) = self.connection.within(client.get_data(&path)).await.ok()?;
        let (ttl, _) = lease_of(&data);
        let written = std::time::UNIX_EPOCH + Duration::from_millis(stat.mtime.try_into().ok()?);
        let ttl = ttl?;
        Some(
            (written + ttl)
                .duration_since(std::time::SystemTime::now())
                .unwrap_or(ttl),
        )
    }

    async fn deletions(&self, key: &str) -> EngineResult<Deletions> {
        Ok(self.wakes.follow(key))
    }

    /// Watches the entries whose going may let the caller hold: a writer's predecessor, a
    /// reader's nearest writer ahead, a permit's holders.
    fn waiting_behind(&self, key: &str, ahead: &[Entry<i64>], kind: LockKind) {
        let queue = self.paths.queue(key);
        let blockers: Vec<(String, String)> = order::blockers(ahead, kind)
            .into_iter()
            .filter_map(|entry| {
                let name = nodes::entry_name(&entry.owner, entry.kind?, entry.lease);
                Some((entry.owner.clone(), format!("{queue}/{name}")))
            })
            .collect();
        let (connection, wakes, key) =
            (self.connection.clone(), self.wakes.clone(), key.to_owned());
        // On the live session (no request is waited for: the waiter's own join just made it).
        tokio::spawn(async move {
            if let Ok(client) = connection.client().await {
                wakes.watch(&client, &key, blockers);
            }
        });
    }

    async fn keys(&self) -> EngineResult<Vec<String>> {
        let client = self.connection.client().await?;
        let children = self.children(&client, &self.paths.root).await?;
        Ok(children
            .iter()
            .filter_map(|name| nodes::decode(name))
            .collect())
    }

    async fn follow(&self, key: &str, events: KeyEventSender) -> EngineResult<()> {
        self.follow_key(key, events).await
    }

    async fn doctor(&self) -> EngineResult<Vec<Finding>> {
        self.diagnose().await
    }

    fn close(&self) {
        self.wakes.close();
    }
}
