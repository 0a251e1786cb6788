//! Presence: while an entry of this process is in a queue, a MySQL named lock
//! (`GET_LOCK`) derived from its key and owner is held on a connection of this process, and a
//! waiter behind it blocks on that name in the server (`wakes.rs`) — woken the moment the entry
//! leaves, or the connection holding its presence ends.
//!
//! A named lock belongs to the session that took it, so the joins and leaves of a key always run
//! on the same connection: one of [`SHARDS`] connections, chosen by the key. A join takes the
//! entry's presence in the same request, before its `CALL` (so a waiter that reads the entry
//! finds its presence held); a leave gives it back in the same request, after its `CALL` (so a
//! waiter woken finds the entry gone). A connection that breaks, or whose request is dropped
//! midway, is closed and opened anew at the next request: the presences it held end with it,
//! which wakes their waiters early — they find the entries still there and keep waiting on their
//! timers (see `wakes.rs`).

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlRow};
use sqlx::{AssertSqlSafe, Connection};
use tokio::sync::Mutex;

/// Connections that run joins and leaves and hold the presences: the joins and leaves of
/// different keys run this many at a time.
pub(crate) const SHARDS: usize = 4;

/// The named lock of the entry of `owner` in the queue `lock` (both as hex literals): `dl:` and
/// 56 hex digits of their SHA-256, within the 64 characters a name may have, and naming no
/// owner (which is a secret) to whoever lists the server's locks.
pub(crate) fn name(lock: &str, owner: &str) -> String {
    format!("CONCAT('dl:', LEFT(SHA2(CONCAT({lock}, X'00', {owner}), 256), 56))")
}

/// Takes the presence `name` on this connection unless it holds it already (a named lock taken
/// twice would need two releases).
pub(crate) fn take(name: &str) -> String {
    format!("DO IF(IS_USED_LOCK({name}) <=> CONNECTION_ID(), 1, GET_LOCK({name}, 0))")
}

/// Gives the presence `name` back (nothing when another session holds it, or nobody does).
pub(crate) fn give_back(name: &str) -> String {
    format!("DO RELEASE_LOCK({name})")
}

pub(crate) struct Shards {
    options: MySqlConnectOptions,
    connections: Vec<Mutex<Option<MySqlConnection>>>,
}

impl Shards {
    pub(crate) fn new(options: MySqlConnectOptions) -> Shards {
        Shards {
            options,
            connections: (0..SHARDS).map(|_| Mutex::new(None)).collect(),
        }
    }

    /// Runs `sql` on the connection of `key`'s shard, opening it first if needed.
    ///
    /// # Cancel safety
    /// Not cancel safe: the request may be applied anyway. Dropped midway, the connection is
    /// closed (its state is unknown), and the presences it held end with it.
    pub(crate) async fn run(&self, key: &str, sql: &str) -> Result<Vec<MySqlRow>, sqlx::Error> {
        let mut slot = self.connections[shard_of(key)].lock().await;
        // Out of the slot while in use: a request dropped midway drops its connection.
        let mut connection = match slot.take() {
            Some(connection) => connection,
            None => MySqlConnection::connect_with(&self.options).await?,
        };
        let reply = sqlx::raw_sql(AssertSqlSafe(sql))
            .fetch_all(&mut connection)
            .await;
        // The server answered (rows or a refusal): the connection is in a known state.
        if matches!(&reply, Ok(_) | Err(sqlx::Error::Database(_))) {
            *slot = Some(connection);
        }
        reply
    }

    /// Closes every connection (the backend shut down): their presences end.
    pub(crate) fn close(&self) {
        for connection in &self.connections {
            if let Ok(mut slot) = connection.try_lock() {
                slot.take();
            }
        }
    }
}

/// The shard of `key`: FNV-1a of its bytes.
fn shard_of(key: &str) -> usize {
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % SHARDS as u64) as usize
}
