//! The ZooKeeper fixture: a 3-server ensemble on loopback, and waiting on its events.

use super::{Fixture, PREFIX};
use distlock::{Backend, BackendBuilder};
use distlock_test_support::{RedisServer, ZkEnsemble};
use std::time::{Duration, Instant};
use zookeeper_client as zk;

/// The ZooKeeper backend on a 3-server ensemble, with a 15-minute session.
pub struct Zookeeper {
    pub ensemble: ZkEnsemble,
    backend: Backend,
    builder: BackendBuilder,
}

impl Zookeeper {
    /// A client of the ensemble, for what the tests read behind the backend's back.
    pub async fn client(&self) -> zk::Client {
        connect(&self.ensemble).await
    }
}

/// A client of `ensemble` (a session of its own).
pub async fn connect(ensemble: &ZkEnsemble) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(30))
        .connect(&ensemble.hosts().join(","))
        .await
        .expect("the ensemble answers")
}

/// A backend of `builder` with its session open: a fresh ensemble's servers take hundreds of
/// milliseconds for their first sessions, longer than some tests' whole leases, which a first
/// acquire would otherwise spend connecting.
fn open(builder: &BackendBuilder) -> Backend {
    let backend = builder.clone().build().expect("valid settings");
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(backend.ping()))
        .expect("the ensemble answers a ping");
    backend
}

/// The queues (lock keys) with an entry in them, under `prefix`.
pub async fn queued_keys(client: &zk::Client, prefix: &str) -> Vec<String> {
    let root = format!("/{prefix}");
    let Ok(queues) = client.list_children(&root).await else {
        return Vec::new();
    };
    // Every queue's children asked at once: one round trip, however many queues there are.
    let paths: Vec<String> = queues
        .iter()
        .map(|queue| format!("{root}/{queue}"))
        .collect();
    let children =
        futures_util::future::join_all(paths.iter().map(|path| client.list_children(path))).await;
    queues
        .iter()
        .zip(children)
        .filter(|(_, children)| children.as_ref().is_ok_and(|c| !c.is_empty()))
        .map(|(queue, _)| decode(queue))
        .collect()
}

/// A key as it was written into a node's name (`%XX` for each byte other than letters,
/// digits, `_`, `:` and `-`).
fn decode(name: &str) -> String {
    let mut bytes = Vec::new();
    let mut rest = name.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'%' {
            let hex = std::str::from_utf8(&tail[..2]).unwrap();
            bytes.push(u8::from_str_radix(hex, 16).unwrap());
            rest = &tail[2..];
        } else {
            bytes.push(first);
            rest = tail;
        }
    }
    String::from_utf8(bytes).unwrap()
}

impl Fixture for Zookeeper {
    fn start(configure: impl FnOnce(BackendBuilder) -> BackendBuilder) -> Self {
        let ensemble = ZkEnsemble::start(3);
        // A session that covers the suite's longest fixed lease (600 s).
        let url = format!("{}?session_timeout=15m", ensemble.url());
        let builder = configure(Backend::builder(url).prefix(PREFIX));
        Zookeeper {
            backend: open(&builder),
            builder,
            ensemble,
        }
    }

    fn backend(&self) -> &Backend {
        &self.backend
    }

    /// ZooKeeper keeps no token marker: the zxid a token is taken from never goes back.
    async fn forget_token_marker(&self, _key: &str) {}

    /// The time left of the holder's lease, as the process that holds it knows it.
    async fn pttl(&self, key: &str) -> Option<Duration> {
        let holder = self.backend.inspect(key).await.unwrap()?;
        Some(holder.ttl)
    }

    fn contender(&self) -> Backend {
        open(&self.builder)
    }

    /// Keys among `candidates` with any entry left in their queue.
    async fn held_keys(&self, candidates: &[String]) -> Vec<String> {
        let queued = queued_keys(&self.client().await, PREFIX).await;
        candidates
            .iter()
            .filter(|key| queued.contains(key))
            .cloned()
            .collect()
    }

    fn kind(&self) -> &'static str {
        "zookeeper"
    }

    fn servers(&self) -> Vec<&RedisServer> {
        Vec::new()
    }

    fn least_token(&self) -> u64 {
        1
    }

    fn grants_in_a_row(&self) -> usize {
        2_000
    }

    fn zookeeper(&self) -> Option<&ZkEnsemble> {
        Some(&self.ensemble)
    }
}

/// Waits up to `within` until `check` holds, re-checked at every node made or deleted under
/// the test prefix (an entry that lapses with its lease or session is deleted: a change too).
pub async fn until_on_zookeeper(
    ensemble: &ZkEnsemble,
    within: Duration,
    mut check: impl AsyncFnMut() -> bool,
) -> bool {
    let deadline = Instant::now() + within;
    let client = connect(ensemble).await;
    // Set before the first check: no change after it is missed.
    let mut watcher = client
        .watch("/", zk::AddWatchMode::PersistentRecursive)
        .await
        .unwrap();
    loop {
        if check().await {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, watcher.changed()).await.is_err() {
            return check().await;
        }
    }
}
