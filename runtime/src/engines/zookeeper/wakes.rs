//! Waking waiters the way ZooKeeper's lock recipe does: a waiter of this process watches only
//! the entries whose going may let it hold — a writer its predecessor, a reader the nearest
//! writer ahead, a permit the holders ahead — with one `exists` watch each, so a release wakes
//! the one waiter behind it and nobody else (no herd).
//!
//! The watch is set with the check that the entry is there: an entry already gone is told at
//! once. Either way its going is told to the queue engine's watch after the waiter's read of
//! the queue, so it is never taken as a deletion the read had already seen. A watch that ends
//! otherwise (the session ended, the request failed) tells the same: its waiter looks again.
//! A watch stops, telling nothing, once nobody follows its queue any more.

use crate::engines::queue::store::{Deletion, Deletions};
use futures_util::StreamExt;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::mpsc;
use zookeeper_client as zk;

/// The watches of one queue.
struct Queue {
    /// Which following of the queue this is (a queue followed anew gets a new one).
    id: u64,
    /// The only sender of the queue's stream: it ends when this goes.
    deletions: mpsc::UnboundedSender<Deletion>,
    /// Entries (their paths) being watched.
    watching: HashSet<String>,
}

#[derive(Default)]
pub(crate) struct Wakes {
    queues: Arc<Mutex<HashMap<String, Queue>>>,
    /// The order of deletions told: a read placed at this value happened before every
    /// deletion told later.
    told: Arc<AtomicU64>,
    /// The last [`Queue::id`] given.
    followed: AtomicU64,
}

impl Wakes {
    /// Where a read of a queue made now stands among the deletions told.
    pub(crate) fn now(&self) -> u64 {
        self.told.load(Ordering::Acquire)
    }

    /// A stream of the deletions told for `key`'s queue, from now until the next call for the
    /// same queue or [`close`](Self::close).
    pub(crate) fn follow(&self, key: &str) -> Deletions {
        let (sender, mut receiver) = mpsc::unbounded_channel();
        let id = self.followed.fetch_add(1, Ordering::Relaxed) + 1;
        self.lock().insert(
            key.to_owned(),
            Queue {
                id,
                deletions: sender,
                watching: HashSet::new(),
            },
        );
        futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx)).boxed()
    }

    /// Watches each of `blockers` (owner and path) not watched yet for `key`'s queue, on
    /// `client`'s session; their going is told on the queue's stream.
    pub(crate) fn watch(&self, client: &zk::Client, key: &str, blockers: Vec<(String, String)>) {
        let mut queues = self.lock();
        let Some(queue) = queues.get_mut(key) else {
            return;
        };
        for (owner, path) in blockers {
            if !queue.watching.insert(path.clone()) {
                continue;
            }
            let watch = Watch {
                followers: queue.deletions.clone(),
                queues: self.queues.clone(),
                told: self.told.clone(),
                key: key.to_owned(),
                id: queue.id,
                owner,
                path,
            };
            tokio::spawn(watch.run(client.clone()));
        }
    }

    /// Ends every stream (the backend shut down).
    pub(crate) fn close(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Queue>> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One entry watched for one following of a queue.
struct Watch {
    /// The queue's stream: the watch stops once it is dropped.
    followers: mpsc::UnboundedSender<Deletion>,
    queues: Arc<Mutex<HashMap<String, Queue>>>,
    told: Arc<AtomicU64>,
    key: String,
    id: u64,
    owner: String,
    path: String,
}

impl Watch {
    /// Waits until the entry is gone (or the watch ended otherwise), then tells it; stops once
    /// nobody follows the queue.
    async fn run(self, client: zk::Client) {
        let followers = self.followers.clone();
        tokio::select! {
            () = followers.closed() => {}
            () = self.gone(&client) => self.tell(),
        }
    }

    /// Resolves once the entry is gone, or its watch ended otherwise.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping it drops its watch (the client removes it from the server).
    async fn gone(&self, client: &zk::Client) {
        loop {
            let watcher = match client.check_and_watch_stat(&self.path).await {
                Ok((Some(_), watcher)) => watcher,
                Ok((None, _)) | Err(_) => break,
            };
            let event = watcher.changed().await;
            // A change of the entry's data leaves it in place: watch again.
            if event.event_type != zk::EventType::NodeDataChanged {
                break;
            }
        }
    }

    fn tell(self) {
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        let Some(queue) = queues
            .get_mut(&self.key)
            .filter(|queue| queue.id == self.id)
        else {
            return;
        };
        queue.watching.remove(&self.path);
        let at = self.told.fetch_add(1, Ordering::AcqRel) + 1;
        let deletion = Deletion {
            owner: self.owner,
            at,
        };
        if queue.deletions.send(deletion).is_err() {
            queues.remove(&self.key);
        }
    }
}
