//! The libraries under test behind one interface: acquire a key (waiting while it is busy),
//! release it. Each is used through its documented API with its default settings; only the TTL
//! is chosen here.

use crate::fifo_floor::{FifoFloor, FloorHeld};
use distlock::{Backend, Lease, Lock};
use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Cycles [`Client::warm_up`] runs.
pub(crate) const WARM_UP_CYCLES: u64 = 50;

/// TTL of the peers' locks and of `distlock-fixed`; long enough never to expire in a workload.
pub(crate) const FIXED_TTL: Duration = Duration::from_secs(10);
/// distlock's wait budget when a key is busy, and distributed-lock-postgres's,
/// distributed-lock-mysql's and zookeeper-client's: far beyond any wait a workload can see, so a
/// `Busy` result (a timeout) is a failure worth reporting, not part of the workload.
const DISTLOCK_WAIT: Duration = Duration::from_secs(10);

pub(crate) const RSLOCK_VERSION: &str = "0.10.0";
pub(crate) const REDLOCK_VERSION: &str = "2.0.0";

/// zookeeper-client's locks: each key a directory (a container node, made with its parent on
/// the first lock of the key, as Curator's `creatingParentContainersIfNeeded` makes them) under
/// this one, as distlock's are under its prefix's node.
const ZOOKEEPER_CLIENT_ROOT: &str = "/zookeeper-client";
/// The name Curator's `InterProcessMutex` gives its lock nodes: `_c_<uuid>-lock-<sequence>`.
const ZOOKEEPER_CLIENT_LOCK_NAME: &str = "lock-";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum LibId {
    /// distlock with the default lease: the watchdog (what `#[distributed_lock]` uses).
    Distlock,
    /// distlock with a fixed lease: no watchdog registration.
    DistlockFixed,
    /// distlock's efficiency locks (`fencing_tokens(false)`), with the watchdog: no fencing
    /// token, an uncontended acquire one `SET NX PX`.
    DistlockUnfenced,
    Rslock,
    Redlock,
    /// Not a library: the least a FIFO handoff through the server costs ([`crate::fifo_floor`]),
    /// run beside the libraries in the contended workloads only.
    FifoFloor,
    /// etcd's own lock service (`Lock`/`Unlock`, the server-side v3lock) through etcd-client,
    /// each lock bound to the client's session lease: the etcd workload's peer.
    EtcdLock,
    /// distributed-lock-postgres: PostgreSQL session advisory locks (`pg_advisory_lock` on a
    /// pooled sqlx 0.8 connection, held until `pg_advisory_unlock`): the postgres workload's
    /// peer.
    DistributedLockPg,
    /// distributed-lock-mysql: MySQL user-level locks (`GET_LOCK` on a pooled sqlx 0.8
    /// connection, held until `RELEASE_LOCK`): the mysql workload's peer.
    DistributedLockMysql,
    /// zookeeper-client's own lock recipe (`Client::lock` with a Curator prefix: an ephemeral
    /// sequential node, each waiter watching the node ahead of its own), one session per
    /// client: the zookeeper workload's peer.
    ZookeeperClient,
    /// Not a library: the least a lock through redis-rs costs on the client, `SET NX PX` and a
    /// compare-and-delete script by hand on one multiplexed connection, counted beside the
    /// libraries in the counts workload only.
    RedisRs,
}

impl LibId {
    pub(crate) const ALL: [LibId; 5] = [
        LibId::Distlock,
        LibId::DistlockFixed,
        LibId::DistlockUnfenced,
        LibId::Rslock,
        LibId::Redlock,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            LibId::Distlock => "distlock",
            LibId::DistlockFixed => "distlock-fixed",
            LibId::DistlockUnfenced => "distlock-unfenced",
            LibId::Rslock => "rslock",
            LibId::Redlock => "redlock",
            LibId::FifoFloor => "fifo-floor",
            LibId::EtcdLock => "etcd-lock",
            LibId::DistributedLockPg => "distributed-lock-pg",
            LibId::DistributedLockMysql => "distributed-lock-mysql",
            LibId::ZookeeperClient => "zookeeper-client",
            LibId::RedisRs => "redis-rs",
        }
    }

    /// A library `--libs` may name.
    pub(crate) fn from_name(name: &str) -> Option<LibId> {
        LibId::ALL.into_iter().find(|lib| lib.name() == name)
    }

    /// What a worker process may run: a library, the FIFO floor or the redis-rs floor.
    pub(crate) fn for_worker(name: &str) -> Option<LibId> {
        LibId::from_name(name).or([LibId::FifoFloor, LibId::RedisRs]
            .into_iter()
            .find(|lib| lib.name() == name))
    }
}

/// One library's client, connected to one server.
pub(crate) struct Client {
    pub(crate) lib: LibId,
    inner: Inner,
}

enum Inner {
    Distlock { backend: Backend, lease: Lease },
    Rslock(rslock::LockManager),
    Redlock(redlock::RedLock),
    FifoFloor(Box<FifoFloor>),
    EtcdLock(Box<EtcdSession>),
    DistributedLockPg(distributed_lock_postgres::PostgresLockProvider),
    DistributedLockMysql(distributed_lock_mysql::MySqlLockProvider),
    ZookeeperClient(zookeeper_client::Client),
    RedisRs(Box<RedisRsFloor>),
}

/// The redis-rs floor ([`LibId::RedisRs`]): one multiplexed connection, opened on first use.
struct RedisRsFloor {
    client: redis::Client,
    connection: tokio::sync::OnceCell<redis::aio::MultiplexedConnection>,
    release: redis::Script,
    next: std::sync::atomic::AtomicU64,
}

impl RedisRsFloor {
    async fn connection(&self) -> Result<redis::aio::MultiplexedConnection, String> {
        self.connection
            .get_or_try_init(|| self.client.get_multiplexed_async_connection())
            .await
            .cloned()
            .map_err(|err| format!("redis-rs: {err}"))
    }

    /// `SET key value NX PX` with a value of this process's own; an error if the key is busy
    /// (the floor is counted on fresh keys only).
    async fn acquire(&self, key: &str) -> Result<Held, String> {
        use std::sync::atomic::Ordering;
        let value = format!(
            "{}-{}",
            std::process::id(),
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let key = peer_key("redis-rs", key);
        let set: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&value)
            .arg("NX")
            .arg("PX")
            .arg(FIXED_TTL.as_millis() as u64)
            .query_async(&mut self.connection().await?)
            .await
            .map_err(|err| format!("redis-rs: {err}"))?;
        match set {
            Some(_) => Ok(Held::RedisRs { key, value }),
            None => Err(format!("redis-rs: {key} is busy")),
        }
    }

    /// The compare-and-delete script (`EVALSHA`, `EVAL` on `NOSCRIPT`).
    async fn release(&self, key: String, value: String) -> Result<(), String> {
        let deleted: i64 = self
            .release
            .key(&key)
            .arg(&value)
            .invoke_async(&mut self.connection().await?)
            .await
            .map_err(|err| format!("redis-rs: {err}"))?;
        match deleted {
            1 => Ok(()),
            _ => Err(format!("redis-rs: {key} was no longer ours")),
        }
    }
}

/// An etcd-client connection, and the sessions its locks are taken in: etcd's lock service
/// names a lock's key after its lease, so two tasks locking with one lease would both hold it
/// (a session's lock is reentrant); each task takes a session of its own from the pool, a lease
/// kept alive by a task for as long as the client lives (as etcd's `concurrency.Session`).
struct EtcdSession {
    client: etcd_client::Client,
    idle: std::sync::Mutex<Vec<i64>>,
    keep_alive: std::sync::Mutex<Vec<tokio::task::AbortHandle>>,
}

impl EtcdSession {
    /// A lease no task is locking with: an idle one, or a new one kept alive from now on.
    async fn take(&self) -> Result<i64, String> {
        if let Some(lease) = self.idle.lock().unwrap().pop() {
            return Ok(lease);
        }
        let mut leases = self.client.lease_client();
        let lease = leases
            .grant(FIXED_TTL.as_secs() as i64, None)
            .await
            .map_err(|err| format!("etcd lease: {err}"))?
            .id();
        let (mut keeper, mut answers) = leases
            .keep_alive(lease)
            .await
            .map_err(|err| format!("etcd keep-alive: {err}"))?;
        let task = tokio::spawn(async move {
            while keeper.keep_alive().await.is_ok() && answers.message().await.is_ok() {
                tokio::time::sleep(FIXED_TTL / 3).await;
            }
        });
        self.keep_alive.lock().unwrap().push(task.abort_handle());
        Ok(lease)
    }
}

impl Drop for EtcdSession {
    fn drop(&mut self) {
        for task in self.keep_alive.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

/// A held lock of any library.
pub(crate) enum Held {
    Distlock(distlock::LockGuard),
    Rslock(rslock::LockGuard),
    /// redlock's `Lock` borrows its manager; keep what `unlock` needs and rebuild it there.
    Redlock {
        resource: Vec<u8>,
        val: Vec<u8>,
    },
    FifoFloor(FloorHeld),
    /// The key etcd's lock service answered with (what `Unlock` takes), and the session's
    /// lease, given back to the pool at the release.
    EtcdLock(Vec<u8>, i64),
    /// The pooled connection that holds the advisory lock, given back to the pool at the
    /// release.
    DistributedLockPg(distributed_lock_postgres::handle::PostgresLockHandle),
    /// The pooled connection that holds the user-level lock, given back to the pool at the
    /// release.
    DistributedLockMysql(distributed_lock_mysql::MySqlLockHandle),
    /// The path of the lock node, which the release deletes.
    ZookeeperClient(String),
    /// The key and the value `SET NX PX` wrote.
    RedisRs {
        key: String,
        value: String,
    },
}

impl Client {
    /// A client of `lib` on the Redis at `url` — or, with several comma-separated URLs, on those
    /// masters in each library's Redlock mode. Connections open lazily, on first use, as each
    /// library does by itself.
    pub(crate) fn connect(lib: LibId, url: &str) -> Result<Client, String> {
        let urls: Vec<&str> = url.split(',').collect();
        let inner = match lib {
            LibId::Distlock | LibId::DistlockFixed | LibId::DistlockUnfenced => Inner::Distlock {
                backend: Backend::builder(url)
                    .prefix("bench")
                    .fencing_tokens(lib != LibId::DistlockUnfenced)
                    .build()
                    .map_err(|err| format!("distlock backend: {err}"))?,
                lease: match lib {
                    LibId::DistlockFixed => Lease::Fixed(FIXED_TTL),
                    _ => Lease::Watchdog,
                },
            },
            LibId::Rslock => Inner::Rslock(rslock::LockManager::new(urls)),
            LibId::Redlock => Inner::Redlock(redlock::RedLock::new(urls)),
            LibId::FifoFloor => Inner::FifoFloor(Box::new(FifoFloor::new(url)?)),
            LibId::EtcdLock => return Err("etcd-lock connects with Client::etcd_lock".into()),
            LibId::DistributedLockPg => {
                return Err("distributed-lock-pg connects with Client::distributed_lock_pg".into())
            }
            LibId::DistributedLockMysql => {
                return Err(
                    "distributed-lock-mysql connects with Client::distributed_lock_mysql".into(),
                )
            }
            LibId::ZookeeperClient => {
                return Err("zookeeper-client connects with Client::zookeeper_client".into())
            }
            LibId::RedisRs => Inner::RedisRs(Box::new(RedisRsFloor {
                client: redis::Client::open(url).map_err(|err| format!("redis-rs: {err}"))?,
                connection: tokio::sync::OnceCell::new(),
                release: redis::Script::new(
                    "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                     return redis.call('DEL', KEYS[1]) else return 0 end",
                ),
                next: std::sync::atomic::AtomicU64::new(0),
            })),
        };
        Ok(Client { lib, inner })
    }

    /// etcd's lock service on the cluster of `endpoints` (`host:port`), each lock in a
    /// session of its own ([`EtcdSession`]).
    pub(crate) async fn etcd_lock(endpoints: &[String]) -> Result<Client, String> {
        let client = etcd_client::Client::connect(endpoints, None)
            .await
            .map_err(|err| format!("etcd-client: {err}"))?;
        let session = EtcdSession {
            client,
            idle: std::sync::Mutex::default(),
            keep_alive: std::sync::Mutex::default(),
        };
        Ok(Client {
            lib: LibId::EtcdLock,
            inner: Inner::EtcdLock(Box::new(session)),
        })
    }

    /// distributed-lock-postgres on the PostgreSQL at `url`, through the pool its builder opens
    /// from a connection string: sqlx's default pool, up to 10 connections, each checked by a
    /// round trip when it is taken from the pool and again when it is given back.
    pub(crate) async fn distributed_lock_pg(url: &str) -> Result<Client, String> {
        let provider = distributed_lock_postgres::PostgresLockProviderBuilder::new()
            .connection_string(url)
            .build()
            .await
            .map_err(|err| format!("distributed-lock-postgres: {err}"))?;
        Ok(Client {
            lib: LibId::DistributedLockPg,
            inner: Inner::DistributedLockPg(provider),
        })
    }

    /// distributed-lock-mysql on the MySQL or MariaDB at `url`, through the pool its builder
    /// opens from a connection string: sqlx's default pool, up to 10 connections, each checked by
    /// a round trip when it is taken from the pool and again when it is given back; no
    /// keepalive queries while a lock is held (its default).
    pub(crate) async fn distributed_lock_mysql(url: &str) -> Result<Client, String> {
        let provider = distributed_lock_mysql::MySqlLockProviderBuilder::new()
            .connection_string(url)
            .build()
            .await
            .map_err(|err| format!("distributed-lock-mysql: {err}"))?;
        Ok(Client {
            lib: LibId::DistributedLockMysql,
            inner: Inner::DistributedLockMysql(provider),
        })
    }

    /// zookeeper-client on the ensemble of `hosts` (`host:port`): one session, opened here, on a
    /// server the crate picks at random among them (as distlock's ZooKeeper engine does), with
    /// its default session timeout.
    pub(crate) async fn zookeeper_client(hosts: &[String]) -> Result<Client, String> {
        let client = zookeeper_client::Client::connect(&hosts.join(","))
            .await
            .map_err(|err| format!("zookeeper-client: {err}"))?;
        Ok(Client {
            lib: LibId::ZookeeperClient,
            inner: Inner::ZookeeperClient(client),
        })
    }

    /// distlock on a backend built by the caller (a setting the other libraries lack), with the
    /// watchdog lease.
    pub(crate) fn distlock(backend: Backend) -> Client {
        Client {
            lib: LibId::Distlock,
            inner: Inner::Distlock {
                backend,
                lease: Lease::Watchdog,
            },
        }
    }

    /// redlock's API blocks the calling thread (and opens a TCP connection per command): its
    /// workers run on threads of their own, never on the shared runtime.
    pub(crate) fn is_blocking(&self) -> bool {
        matches!(self.inner, Inner::Redlock(_))
    }

    /// Acquires `key`, waiting while another holder has it, the way each library documents
    /// waiting: distlock with a wait budget, rslock's `acquire` (which retries after a random
    /// delay of up to 200 ms), redlock's `lock` in a loop (what its `acquire` does, retrying
    /// after a random sleep of up to 200 ms), distributed-lock-postgres's `acquire` with
    /// distlock's wait budget (which PostgreSQL enforces as `lock_timeout` while the waiter sits
    /// in its lock queue, inside `pg_advisory_lock`), distributed-lock-mysql's `acquire` with
    /// the same budget (`GET_LOCK`'s timeout: the waiter blocks inside the server until the
    /// holder's `RELEASE_LOCK` or the timeout), zookeeper-client's `lock` within the same budget
    /// (it has none of its own; its future is cancel safe: a lock given up on is deleted). `lock`
    /// returns once the node it made is the oldest of the directory's: the lock is held.
    pub(crate) async fn acquire(&self, key: &str) -> Result<Held, String> {
        match &self.inner {
            Inner::Distlock { backend, lease } => Lock::new(key)
                .on(backend)
                .lease(*lease)
                .wait(DISTLOCK_WAIT)
                .acquire()
                .await
                .map(Held::Distlock)
                .map_err(|err| err.to_string()),
            Inner::Rslock(manager) => manager
                .acquire(peer_key("rslock", key).as_bytes(), FIXED_TTL)
                .await
                .map(Held::Rslock)
                .map_err(|err| err.to_string()),
            Inner::Redlock(manager) => {
                let resource = peer_key("redlock", key).into_bytes();
                loop {
                    match manager.lock(&resource, FIXED_TTL.as_millis() as usize) {
                        Ok(Some(lock)) => {
                            return Ok(Held::Redlock {
                                resource: lock.resource,
                                val: lock.val,
                            })
                        }
                        Ok(None) => continue,
                        Err(err) => return Err(err.to_string()),
                    }
                }
            }
            Inner::FifoFloor(floor) => floor.acquire(key).await.map(Held::FifoFloor),
            Inner::EtcdLock(session) => {
                let lease = session.take().await?;
                let options = etcd_client::LockOptions::new().with_lease(lease);
                let name = peer_key("etcd-lock", key);
                let locked = session.client.lock_client().lock(name, Some(options)).await;
                match locked {
                    Ok(locked) => Ok(Held::EtcdLock(locked.key().to_vec(), lease)),
                    Err(err) => {
                        session.idle.lock().unwrap().push(lease);
                        Err(err.to_string())
                    }
                }
            }
            Inner::DistributedLockPg(provider) => provider
                .create_lock(&peer_key("distributed-lock-pg", key))
                .acquire(Some(DISTLOCK_WAIT))
                .await
                .map(Held::DistributedLockPg)
                .map_err(|err| err.to_string()),
            Inner::DistributedLockMysql(provider) => provider
                .create_lock(&peer_key("distributed-lock-mysql", key))
                .acquire(Some(DISTLOCK_WAIT))
                .await
                .map(Held::DistributedLockMysql)
                .map_err(|err| err.to_string()),
            Inner::ZookeeperClient(client) => zookeeper_client_lock(client, key).await,
            Inner::RedisRs(floor) => floor.acquire(key).await,
        }
    }

    pub(crate) async fn release(&self, held: Held) -> Result<(), String> {
        match (&self.inner, held) {
            (Inner::Distlock { .. }, Held::Distlock(guard)) => match guard.release().await {
                Ok(distlock::Released::Released) => Ok(()),
                Ok(other) => Err(format!("release found the lock {other:?}")),
                Err(err) => Err(err.to_string()),
            },
            (Inner::Rslock(_), Held::Rslock(guard)) => {
                guard.release().await;
                Ok(())
            }
            (Inner::Redlock(manager), Held::Redlock { resource, val }) => {
                manager.unlock(&redlock::Lock {
                    resource,
                    val,
                    validity_time: 0,
                    lock_manager: manager,
                });
                Ok(())
            }
            (Inner::FifoFloor(floor), Held::FifoFloor(held)) => floor.release(held).await,
            (Inner::EtcdLock(session), Held::EtcdLock(key, lease)) => {
                let unlocked = session.client.lock_client().unlock(key).await;
                session.idle.lock().unwrap().push(lease);
                unlocked.map(drop).map_err(|err| err.to_string())
            }
            // Its release answers `Ok` whatever `pg_advisory_unlock` answered (a failure is only
            // logged), so an error here is never seen.
            (Inner::DistributedLockPg(_), Held::DistributedLockPg(handle)) => {
                handle.release().await.map_err(|err| err.to_string())
            }
            // Its release answers `Ok` whatever `RELEASE_LOCK` answered (1, 0 for a lock this
            // connection does not hold, NULL for none), so only a failed statement is seen.
            (Inner::DistributedLockMysql(_), Held::DistributedLockMysql(handle)) => {
                handle.release().await.map_err(|err| err.to_string())
            }
            // The lock node deleted, and the deletion answered: the next waiter's watch fires
            // on it. (See `zookeeper_client_lock` for why this is not the guard's drop.)
            (Inner::ZookeeperClient(client), Held::ZookeeperClient(path)) => client
                .delete(&path, None)
                .await
                .map_err(|err| format!("zookeeper-client: deleting {path}: {err}")),
            (Inner::RedisRs(floor), Held::RedisRs { key, value }) => {
                floor.release(key, value).await
            }
            _ => Err("a lock released through another library's client".into()),
        }
    }

    /// Opens the connections and loads the scripts, so that no timed phase pays for either.
    pub(crate) async fn warm_up(&self, tag: &str) -> Result<(), String> {
        for i in 0..WARM_UP_CYCLES {
            let held = self.acquire(&format!("warmup:{tag}:{i}")).await?;
            self.release(held).await?;
        }
        Ok(())
    }
}

/// zookeeper-client's lock on `key`: `Client::lock` with Curator's prefix in the key's directory,
/// the directory (and its parent) made as containers when missing, within [`DISTLOCK_WAIT`].
///
/// The crate releases a lock by dropping its guard: `LockClient`'s `Drop` spawns a task that
/// deletes the node in the background and returns at once. Dropping it would let a cycle end
/// before its release reached the ensemble (the next lock's requests overtaking the deletion),
/// where every other library's release here is awaited. So the guard is forgotten once the lock
/// is held, keeping only its node's path, and the release deletes that node itself and waits
/// for the answer (the crate's own lock test deletes a lock node with `Client::delete` too).
/// Forgetting the guard leaks the path's string and nothing else: it borrows the client and owns
/// only that. Dropping it after the deletion instead would send a second delete, a write
/// through the leader that fails.
async fn zookeeper_client_lock(
    client: &zookeeper_client::Client,
    key: &str,
) -> Result<Held, String> {
    use zookeeper_client as zk;
    let dir = format!("{ZOOKEEPER_CLIENT_ROOT}/{key}");
    let prefix = zk::LockPrefix::new_curator(&dir, ZOOKEEPER_CLIENT_LOCK_NAME)
        .map_err(|err| format!("zookeeper-client: lock prefix {dir}: {err}"))?;
    let parents = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    let options = zk::LockOptions::new(zk::Acls::anyone_all())
        .with_ancestor_options(parents)
        .map_err(|err| format!("zookeeper-client: lock options: {err}"))?;
    match tokio::time::timeout(DISTLOCK_WAIT, client.lock(prefix, b"", options)).await {
        Ok(Ok(lock)) => {
            let path = lock.lock_path().to_owned();
            std::mem::forget(lock);
            Ok(Held::ZookeeperClient(path))
        }
        Ok(Err(err)) => Err(format!("zookeeper-client: lock {dir}: {err}")),
        Err(_) => Err(format!(
            "zookeeper-client: lock {dir} not held within {DISTLOCK_WAIT:?}"
        )),
    }
}

/// The peers get a namespace of their own, as distlock's prefix gives it one.
fn peer_key(lib: &str, key: &str) -> String {
    format!("{lib}:{key}")
}

/// Runs `work(i, client)` for `i` in `0..n` concurrently and collects the results in order:
/// as tasks on the shared runtime, or, for a blocking library, each on a thread of its own with
/// a current-thread runtime (so the same async worker code drives every library).
pub(crate) async fn run_workers<T, F, Fut>(client: &Arc<Client>, n: usize, work: F) -> Vec<T>
where
    F: Fn(usize, Arc<Client>) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    if client.is_blocking() {
        let threads: Vec<_> = (0..n)
            .map(|i| {
                let (work, client) = (work.clone(), client.clone());
                std::thread::Builder::new()
                    .name(format!("bench-worker-{i}"))
                    .spawn(move || {
                        tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .expect("a current-thread runtime")
                            .block_on(work(i, client))
                    })
                    .expect("a worker thread")
            })
            .collect();
        tokio::task::spawn_blocking(move || {
            threads
                .into_iter()
                .map(|thread| {
                    thread
                        .join()
                        .unwrap_or_else(|p| std::panic::resume_unwind(p))
                })
                .collect()
        })
        .await
        .expect("joining worker threads")
    } else {
        let tasks: Vec<_> = (0..n)
            .map(|i| tokio::spawn(work.clone()(i, client.clone())))
            .collect();
        let mut results = Vec::with_capacity(n);
        for task in tasks {
            results.push(
                task.await
                    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())),
            );
        }
        results
    }
}
