//! Test harness for distlock: real `redis-server` processes and a
//! fault-injecting TCP proxy, all on 127.0.0.1.
//!
//! * [`RedisServer`] starts `redis-server` (from `PATH`, or the binary named
//!   by `DISTLOCK_REDIS_SERVER`) on a free port with its own temp dir, waits
//!   for its "Ready to accept connections" log line, and stops, kills,
//!   pauses or restarts it by PID. It never touches a server it did not
//!   start, and never uses port 6379.
//! * [`SentinelGroup`] runs a primary, a replica and three Redis Sentinels
//!   (`redis-server --sentinel`, same binary) monitoring them as
//!   [`MASTER_NAME`], and can kill the primary and wait for the sentinels'
//!   failover to the replica.
//! * [`RedisCluster`] runs a Redis Cluster (`cluster-enabled` servers joined
//!   by `redis-cli --cluster create`, from `PATH` or [`REDIS_CLI_ENV`]):
//!   masters with replicas, each on a port whose cluster bus port (+10000)
//!   is free too ([`free_cluster_port`]). It can tell which node serves a
//!   slot, kill a master and wait for its replica to take over, and move a
//!   slot to another master with the live migration protocol.
//! * [`EtcdCluster`] runs an etcd cluster (`etcd` members with their own
//!   ports and data dirs), tells which member leads, and kills, pauses or
//!   restarts members by PID.
//! * [`PgServer`] runs a PostgreSQL cluster of its own (`initdb`, `postgres` on a free port,
//!   as the `postgres` user when the harness is root), with streaming standbys
//!   ([`PgServer::standby_of`]) and [`PgBouncer`] in front where a test needs one.
//! * [`MariaDbServer`] runs a MariaDB server of its own (`mariadb-install-db`, then `mariadbd`
//!   with `--no-defaults`, a free port and a socket of its own; `--user=root` when root).
//! * [`ZkEnsemble`] runs a ZooKeeper ensemble (Debian's jar under `java`, servers with their
//!   own ports and data dirs), tells which server leads, and kills, pauses or restarts servers
//!   by PID.
//! * [`FaultProxy`] sits between a client and a server and can delay,
//!   hold (blackhole), reset or refuse traffic, or lose exactly one reply.
//! * [`TestPki`] makes a CA, server and client certificates with the
//!   `openssl` tool, for servers started with a TLS port.
//! * [`ChannelListener`] records what a pub/sub channel carries, up to a
//!   `PING` (no timing involved).
//! * [`wait_until`] waits for a condition on one or more servers, re-checking
//!   it each time a server reports a command it executed (`MONITOR`) or,
//!   with [`Wake::CommandsAndExpiries`], a key expiring (keyevent
//!   notifications): never on a timer.
//! * [`Reply`], [`frame_len`] and [`encode_command`] are a small RESP codec,
//!   written by hand so that checking the `redis` crate's behaviour does not
//!   depend on the `redis` crate.
//!
//! ```no_run
//! use distlock_test_support::{RedisServer, Reply};
//!
//! let server = RedisServer::start();
//! assert_eq!(server.command(&["SET", "k", "v"]), Reply::Simple("OK".into()));
//! assert_eq!(server.command(&["GET", "k"]).as_str().as_deref(), Some("v"));
//! ```
//!
//! Waiting is event-driven throughout (log lines, `waitpid`, channels, `MONITOR`);
//! every wait has a deadline and panics with the server log's tail when it
//! passes, rather than hanging the test run.

#![cfg(unix)]

mod client;
mod cluster;
mod etcd;
mod events;
mod listener;
mod mariadb;
mod ports;
mod postgres;
mod process;
mod proxy;
mod resp;
mod rng;
mod sentinel;
mod server;
mod tls;
mod zookeeper;

pub use client::{command_at, pipeline_at};
pub use cluster::{RedisCluster, REDIS_CLI_ENV};
pub use etcd::{EtcdCluster, ETCDCTL_ENV, ETCD_ENV};
pub use events::{wait_until, Wake};
pub use listener::ChannelListener;
pub use mariadb::{MariaDbServer, MARIADB_BINDIR_ENV};
pub use ports::{free_cluster_port, free_port};
pub use postgres::{PgBouncer, PgServer, PoolMode, PGBOUNCER_ENV, PG_BINDIR_ENV};
pub use proxy::{FaultProxy, Framing};
pub use resp::{encode_command, frame_len, parse_reply, try_frame_len, FrameError, Reply};
pub use rng::Xorshift;
pub use sentinel::{SentinelGroup, MASTER_NAME};
pub use server::{RedisServer, ServerConfig, REDIS_SERVER_ENV, VALKEY_SERVER_ENV};
pub use tls::{ServerCert, TestPki};
pub use zookeeper::{ZkEnsemble, ZOOKEEPER_JAR_ENV};
