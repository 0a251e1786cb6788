//! [`MySqlStore`]: the queue engine's [`Store`] on MySQL and MariaDB — each lock's queue rows of
//! a table, each request one `CALL` of a procedure of the lock database (`sql.rs`).
//!
//! Joins and leaves run on the connection that holds their entries' presences (`presence.rs`);
//! a waiter is woken by the presence of the entry it waits for ending (`wakes.rs`), since MySQL
//! tells no change to another connection.

use super::client::{is_deadlock, Connection};
use super::presence::Shards;
use super::sql::{render, schema_request, Arg, Statements, MAX_LOCK_NAME};
use super::wakes::Wakes;
use crate::engines::engine::{EngineFailure, EngineResult, Renewal};
use crate::engines::queue::order::{self, kind_of, tag, Entry};
use crate::engines::queue::store::{Deletions, Presence, Read, Store};
use crate::engines::sql::connection::Creation;
use crate::engines::sql::keys::keys_of;
use crate::lock::key::lock_name;
use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use crate::operating::doctor::{Check, Finding};
use crate::operating::key_events::KeyEventSender;
use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, Row};
use std::time::Duration;

/// How many times a request that deadlocked with other transactions is sent again.
const DEADLOCK_RETRIES: usize = 3;

pub(crate) struct MySqlStore {
    connection: Connection,
    /// The connections of joins and leaves, which hold the entries' presences.
    shards: Shards,
    wakes: Wakes,
    sql: Statements,
    prefix: String,
    label: String,
    /// Whether the schema is created when missing.
    creation: Creation,
}

impl MySqlStore {
    /// The store on `connection` (its requests), `watches` (the connections waiters block on).
    pub(crate) fn new(
        connection: Connection,
        watches: Connection,
        schema: &str,
        create_schema: bool,
        prefix: &str,
        label: &str,
    ) -> MySqlStore {
        MySqlStore {
            shards: Shards::new(connection.options().clone()),
            wakes: Wakes::new(watches),
            connection,
            sql: Statements::of(schema),
            prefix: prefix.to_owned(),
            label: label.to_owned(),
            creation: Creation::new(create_schema),
        }
    }

    pub(crate) fn schema(&self) -> &str {
        &self.sql.schema
    }

    /// The lock's full name, the `lock_key` of its rows; refused when the column cannot hold it.
    fn lock(&self, key: &str) -> EngineResult<String> {
        let lock = lock_name(&self.prefix, key);
        match lock.len() <= MAX_LOCK_NAME {
            true => Ok(lock),
            false => Err(EngineFailure {
                ambiguous: false,
                source: format!(
                    "the lock name `{}…` is {} bytes, over the {MAX_LOCK_NAME} bytes of the MySQL \
                     lock table's column; shorten the key or the prefix",
                    lock.chars().take(32).collect::<String>(),
                    lock.len()
                )
                .into(),
            }),
        }
    }

    /// How long a request waits for a row a fenced transaction has locked, in whole seconds
    /// (what `innodb_lock_wait_timeout` takes; at least 1).
    fn lock_wait_s(&self) -> i64 {
        self.connection.lock_wait().as_secs_f64().ceil().max(1.0) as i64
    }

    /// Runs `sql` (one text-protocol request) on a connection of the pool, or of `key`'s shard
    /// (`Some`), after making sure of the schema; sent again, whole, after a deadlock (the
    /// database rolled it back).
    ///
    /// # Cancel safety
    /// Not cancel safe: the request may be applied anyway, as after a lost reply.
    async fn run(&self, shard: Option<&str>, sql: &str) -> EngineResult<Vec<MySqlRow>> {
        self.connection
            .ensure(&self.creation, self.schema(), || {
                schema_request(self.schema())
            })
            .await?;
        let pool = self.connection.pool();
        let request = async {
            let mut tries = 0;
            loop {
                let reply = match shard {
                    Some(key) => self.shards.run(key, sql).await,
                    None => sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(pool).await,
                };
                match reply {
                    Err(err) if is_deadlock(&err) && tries < DEADLOCK_RETRIES => tries += 1,
                    reply => return reply,
                }
            }
        };
        self.connection.call(self.schema(), request).await
    }

    /// Runs `statement` with `args` written in on a connection of the pool.
    ///
    /// # Cancel safety
    /// Not cancel safe: the request may be applied anyway, as after a lost reply.
    async fn rows(&self, statement: &str, args: &[Arg<'_>]) -> EngineResult<Vec<MySqlRow>> {
        self.run(None, &render(statement, args)).await
    }

    /// The entries of `rows` (owner, token, kind, label, ms left), oldest first.
    fn entries(rows: &[MySqlRow]) -> EngineResult<Vec<Entry<Duration>>> {
        rows.iter().map(entry).collect()
    }

    /// The first column of the first row, an integer: what a procedure answered.
    fn answer(rows: &[MySqlRow], what: &str) -> EngineResult<i64> {
        rows.first()
            .ok_or_else(|| EngineFailure::ambiguous(format!("{what} answered no row")))?
            .try_get(0)
            .map_err(EngineFailure::ambiguous)
    }

    /// The doctor's readings: settings under which a committed grant may be lost.
    async fn settings(&self) -> EngineResult<(i64, i64)> {
        let rows = self
            .rows(
                "SELECT CAST(@@innodb_flush_log_at_trx_commit AS SIGNED), \
                 CAST(@@read_only AS SIGNED)",
                &[],
            )
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| EngineFailure::ambiguous("no settings read"))?;
        let flush = row.try_get(0).map_err(EngineFailure::ambiguous)?;
        let read_only = row.try_get(1).map_err(EngineFailure::ambiguous)?;
        Ok((flush, read_only))
    }
}

/// One entry of a queue row: owner, token, kind, label, milliseconds left.
fn entry(row: &MySqlRow) -> EngineResult<Entry<Duration>> {
    let text = |at: usize| -> EngineResult<String> {
        let bytes: Vec<u8> = row.try_get(at).map_err(EngineFailure::ambiguous)?;
        String::from_utf8(bytes).map_err(EngineFailure::ambiguous)
    };
    let ms_left: i64 = row.try_get(4).map_err(EngineFailure::ambiguous)?;
    Ok(Entry {
        owner: text(0)?,
        token: row.try_get(1).map_err(EngineFailure::ambiguous)?,
        kind: kind_of(&text(2)?),
        label: text(3)?,
        lease: Duration::from_millis(ms_left.max(0) as u64),
    })
}

impl Store for MySqlStore {
    type Lease = Duration;

    async fn join(
        &self,
        key: &str,
        owner: &Owner,
        kind: LockKind,
        ttl: Duration,
    ) -> EngineResult<Read<Duration>> {
        let lock = self.lock(key)?;
        let kind_tag = tag(kind);
        let args = [
            Arg::Bytes(lock.as_bytes()),
            Arg::Bytes(owner.as_str().as_bytes()),
            Arg::Bytes(kind_tag.as_bytes()),
            Arg::Bytes(self.label.as_bytes()),
            Arg::Int(ttl.as_millis().max(1) as i64),
            Arg::Int(self.lock_wait_s()),
        ];
        // On its key's shard: the join takes the entry's presence on that connection.
        let at = self.wakes.now();
        let rows = self
            .run(Some(&lock), &render(&self.sql.join, &args))
            .await?;
        let entries = MySqlStore::entries(&rows)?;
        if let Some(mine) = entries.iter().find(|entry| entry.owner == owner.as_str()) {
            self.shards.joined(&lock, owner.as_str(), mine.token);
        }
        Ok(Read { entries, at })
    }

    async fn leave(&self, key: &str, owner: &Owner) -> EngineResult<Presence> {
        let lock = self.lock(key)?;
        // The token the join read: its presence goes even if another deleted the entry.
        let token = self.shards.token_of(&lock, owner.as_str());
        let args = [
            Arg::Bytes(lock.as_bytes()),
            Arg::Bytes(owner.as_str().as_bytes()),
            Arg::Int(token.unwrap_or(0) as i64),
            Arg::Int(self.lock_wait_s()),
        ];
        // On its key's shard, which holds the presence the leave gives back.
        let rows = self
            .run(Some(&lock), &render(&self.sql.leave, &args))
            .await?;
        self.shards.left(&lock, owner.as_str());
        Ok(Presence::from_code(MySqlStore::answer(&rows, "leave")?))
    }

    /// One request for the batch: a `CALL` per renewal, each its own transaction.
    async fn renew(&self, batch: &[Renewal<'_>]) -> EngineResult<Vec<Option<Presence>>> {
        let mut calls = String::new();
        for renewal in batch {
            let lock = self.lock(renewal.key)?;
            let args = [
                Arg::Bytes(lock.as_bytes()),
                Arg::Bytes(renewal.owner.as_str().as_bytes()),
                Arg::Int(renewal.ttl.as_millis().max(1) as i64),
            ];
            calls.push_str(&render(&self.sql.renew, &args));
            calls.push_str(";\n");
        }
        let rows = self.run(None, &calls).await?;
        if rows.len() != batch.len() {
            return Err(EngineFailure::ambiguous(format!(
                "{} renewals answered {} rows",
                batch.len(),
                rows.len()
            )));
        }
        rows.iter()
            .map(|row| {
                let found: i64 = row.try_get(0).map_err(EngineFailure::ambiguous)?;
                Ok(Some(Presence::from_code(found)))
            })
            .collect()
    }

    async fn read(&self, key: &str) -> EngineResult<Vec<Entry<Duration>>> {
        let lock = self.lock(key)?;
        let rows = self
            .rows(&self.sql.read, &[Arg::Bytes(lock.as_bytes())])
            .await?;
        MySqlStore::entries(&rows)
    }

    async fn remove(&self, key: &str, entry: &Entry<Duration>) -> EngineResult<bool> {
        let lock = self.lock(key)?;
        let args = [
            Arg::Bytes(lock.as_bytes()),
            Arg::Bytes(entry.owner.as_bytes()),
            Arg::Int(entry.token as i64),
            Arg::Int(self.lock_wait_s()),
        ];
        // On its key's shard: an entry of this process gives its presence back there (another's
        // is not this session's).
        let rows = self
            .run(Some(&lock), &render(&self.sql.remove, &args))
            .await?;
        self.shards.left(&lock, &entry.owner);
        Ok(MySqlStore::answer(&rows, "remove")? == 1)
    }

    /// The time left when the entry was read: counted on the database's clock.
    async fn time_left(&self, _key: &str, entry: &Entry<Duration>) -> Option<Duration> {
        Some(entry.lease)
    }

    /// In force at once: a presence is watched by its state, which no deletion before the watch
    /// can hide.
    async fn deletions(&self, key: &str) -> EngineResult<Deletions> {
        Ok(self.wakes.follow(&self.lock(key)?))
    }

    /// Watches the presences of the entries whose going may let the caller hold: a writer's
    /// predecessor, a reader's nearest writer ahead, a permit's holders.
    fn waiting_behind(&self, key: &str, ahead: &[Entry<Duration>], kind: LockKind) {
        let Ok(lock) = self.lock(key) else { return };
        let blockers: Vec<(&str, u64)> = order::blockers(ahead, kind)
            .iter()
            .map(|entry| (entry.owner.as_str(), entry.token))
            .collect();
        self.wakes.watch(&lock, self.schema(), &blockers);
    }

    async fn keys(&self) -> EngineResult<Vec<String>> {
        let start = format!("{}:{{", self.prefix);
        let rows = self
            .rows(&self.sql.keys, &[Arg::Bytes(start.as_bytes())])
            .await?;
        let locks = rows
            .iter()
            .map(|row| {
                let bytes: Vec<u8> = row.try_get(0).map_err(EngineFailure::ambiguous)?;
                String::from_utf8(bytes).map_err(EngineFailure::ambiguous)
            })
            .collect::<EngineResult<Vec<_>>>()?;
        Ok(keys_of(&self.prefix, &locks))
    }

    /// Refused: MySQL tells no change to another connection.
    async fn follow(&self, _key: &str, _events: KeyEventSender) -> EngineResult<()> {
        Err(EngineFailure {
            ambiguous: false,
            source: "MySQL tells no change to another connection, so a key's events cannot be \
                     followed; `distlock show` reads who holds it"
                .into(),
        })
    }

    async fn doctor(&self) -> EngineResult<Vec<Finding>> {
        let (flush, read_only) = self.settings().await?;
        let mut findings = Vec::new();
        if flush != 1 {
            findings.push(Finding {
                check: Check::Persistence,
                advice: format!(
                    "innodb_flush_log_at_trx_commit is {flush}: a crash of the database server \
                     can lose grants it acknowledged, and a lock can be granted twice; set it to \
                     1 for a lock that guards data"
                ),
            });
        }
        if read_only != 0 {
            findings.push(Finding {
                check: Check::Standby,
                advice: "the server is read-only (a replica?): no lock can be taken on it; point \
                         the backend at the primary"
                    .into(),
            });
        }
        Ok(findings)
    }

    fn close(&self) {
        self.shards.close();
    }

    fn sql_schema(&self) -> Option<&str> {
        Some(self.schema())
    }
}
