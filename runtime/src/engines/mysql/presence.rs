//! Presence: while an entry of this process is in a queue, a MySQL named lock
//! (`GET_LOCK`), `dl:<database>:<token>`, is held on a connection of this process, and a waiter
//! behind it blocks on that name in the server (`wakes.rs`) — woken the moment the entry leaves,
//! or the connection holding its presence ends.
//!
//! A named lock belongs to the session that took it, so the joins and leaves of a key always run
//! on the same connection: one of [`SHARDS`] connections, chosen by the key. The join procedure
//! takes the entry's presence inside its transaction, before it commits (so a waiter that reads
//! the entry finds its presence held); the leave procedure gives it back after it commits (so a
//! waiter woken finds the entry gone). A connection that breaks, or whose request is dropped
//! midway, is closed and opened anew at the next request: the presences it held end with it,
//! which wakes their waiters early — they find the entries still there and keep waiting on their
//! timers (see `wakes.rs`).

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlRow};
use sqlx::{AssertSqlSafe, Connection};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use tokio::sync::Mutex as AsyncMutex;

/// Connections that run joins and leaves and hold the presences: the joins and leaves of
/// different keys run this many at a time.
pub(crate) const SHARDS: usize = 4;

/// The presence of the entry `token` of the lock database `schema` (a lowercase identifier of
/// at most 40 bytes), as a string literal: what the procedures take with `CONCAT('dl:',
/// DATABASE(), ':', token)`.
pub(crate) fn name(schema: &str, token: u64) -> String {
    format!("'dl:{schema}:{token}'")
}

pub(crate) struct Shards {
    options: MySqlConnectOptions,
    connections: Vec<AsyncMutex<Option<MySqlConnection>>>,
    /// The token each entry of this process had when its join read it, by lock and owner: its
    /// leave gives that presence back even when another deleted the entry (its lease ran out).
    tokens: Mutex<HashMap<(String, String), u64>>,
}

impl Shards {
    pub(crate) fn new(options: MySqlConnectOptions) -> Shards {
        Shards {
            options,
            connections: (0..SHARDS).map(|_| AsyncMutex::new(None)).collect(),
            tokens: Mutex::default(),
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

    /// `owner`'s join of the queue `lock` read its entry with `token`.
    pub(crate) fn joined(&self, lock: &str, owner: &str, token: u64) {
        self.tokens()
            .insert((lock.to_owned(), owner.to_owned()), token);
    }

    /// The token `owner`'s last join of the queue `lock` read, if any.
    pub(crate) fn token_of(&self, lock: &str, owner: &str) -> Option<u64> {
        self.tokens()
            .get(&(lock.to_owned(), owner.to_owned()))
            .copied()
    }

    /// `owner`'s entry in the queue `lock` left (or was removed).
    pub(crate) fn left(&self, lock: &str, owner: &str) {
        self.tokens().remove(&(lock.to_owned(), owner.to_owned()));
    }

    /// Closes every connection (the backend shut down): their presences end.
    pub(crate) fn close(&self) {
        for connection in &self.connections {
            if let Ok(mut slot) = connection.try_lock() {
                slot.take();
            }
        }
    }

    fn tokens(&self) -> MutexGuard<'_, HashMap<(String, String), u64>> {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The shard of `key`: FNV-1a of its bytes.
fn shard_of(key: &str) -> usize {
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % SHARDS as u64) as usize
}
