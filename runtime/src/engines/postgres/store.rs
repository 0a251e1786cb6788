//! [`PgStore`]: the queue engine's [`Store`] on PostgreSQL — each lock's queue rows of a table,
//! each request one call of a function of the schema (`sql.rs`), its deletions told by
//! `NOTIFY` on one listening connection (`listener.rs`).

use super::client::Connection;
use super::listener::{Listener, Op};
use super::sql::{render, schema_sql, Arg, Statements};
use crate::engines::engine::{EngineFailure, EngineResult, Renewal};
use crate::engines::queue::order::{kind_of, tag, Entry};
use crate::engines::queue::store::{Deletion, Deletions, Presence, Read, Store};
use crate::engines::sql::connection::Creation;
use crate::engines::sql::keys::keys_of;
use crate::lock::key::lock_name;
use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use crate::operating::doctor::{Check, Finding};
use crate::operating::key_events::{KeyEvent, KeyEventSender};
use futures_util::StreamExt;
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Row};
use std::sync::Arc;
use std::time::Duration;

pub(crate) struct PgStore {
    connection: Arc<Connection>,
    sql: Statements,
    prefix: String,
    label: String,
    listener: Listener,
    /// Whether the schema is created when missing.
    creation: Creation,
}

impl PgStore {
    pub(crate) fn new(
        connection: Connection,
        schema: &str,
        create_schema: bool,
        prefix: &str,
        label: &str,
    ) -> PgStore {
        let connection = Arc::new(connection);
        PgStore {
            listener: Listener::new(connection.clone(), schema),
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

    /// How long a request waits for a row a fenced transaction has locked, in milliseconds.
    fn lock_wait_ms(&self) -> i64 {
        self.connection.lock_wait().as_millis().max(1) as i64
    }

    /// The lock's full name, the `key` of its rows.
    fn lock(&self, key: &str) -> String {
        lock_name(&self.prefix, key)
    }

    /// Runs `statement` with `args` written in (one simple-protocol query), after making sure
    /// of the schema.
    ///
    /// # Cancel safety
    /// Not cancel safe: the request may be applied anyway, as after a lost reply.
    async fn rows(&self, statement: &str, args: &[Arg<'_>]) -> EngineResult<Vec<PgRow>> {
        self.connection
            .ensure(&self.creation, self.schema(), || schema_sql(self.schema()))
            .await?;
        let sql = render(statement, args);
        let pool = self.connection.pool();
        self.connection
            .call(
                self.schema(),
                sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(pool),
            )
            .await
    }

    /// The entries of `rows` (owner, token, kind, label, ms left), oldest first.
    fn entries(rows: &[PgRow]) -> EngineResult<Vec<Entry<Duration>>> {
        rows.iter()
            .map(|row| {
                let ms_left: i64 = row.try_get(4).map_err(EngineFailure::ambiguous)?;
                Ok(Entry {
                    owner: row.try_get(0).map_err(EngineFailure::ambiguous)?,
                    token: row.try_get::<i64, _>(1).map_err(EngineFailure::ambiguous)? as u64,
                    kind: kind_of(row.try_get(2).map_err(EngineFailure::ambiguous)?),
                    label: row.try_get(3).map_err(EngineFailure::ambiguous)?,
                    lease: Duration::from_millis(ms_left.max(0) as u64),
                })
            })
            .collect()
    }

    /// The doctor's checks: settings under which a committed grant may be lost.
    async fn settings(&self) -> EngineResult<Vec<(String, String)>> {
        let pool = self.connection.pool();
        let rows = self
            .connection
            .call(
                self.schema(),
                sqlx::raw_sql(
                    "SELECT name, setting FROM pg_settings \
                     WHERE name IN ('fsync', 'synchronous_commit') \
                     UNION ALL SELECT 'in_recovery', pg_is_in_recovery()::text",
                )
                .fetch_all(pool),
            )
            .await?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(EngineFailure::ambiguous)
    }
}

impl Store for PgStore {
    type Lease = Duration;

    async fn join(
        &self,
        key: &str,
        owner: &Owner,
        kind: LockKind,
        ttl: Duration,
    ) -> EngineResult<Read<Duration>> {
        let lock = self.lock(key);
        let ttl_ms = ttl.as_millis().max(1) as i64;
        let kind_tag = tag(kind);
        let args = [
            Arg::Text(&lock),
            Arg::Text(owner.as_str()),
            Arg::Text(&kind_tag),
            Arg::Text(&self.label),
            Arg::Int(ttl_ms),
            Arg::Int(self.lock_wait_ms()),
        ];
        let rows = self.rows(&self.sql.join, &args).await?;
        let at = match rows.first() {
            Some(row) => row.try_get::<i64, _>(5).map_err(EngineFailure::ambiguous)?,
            None => 0,
        };
        Ok(Read {
            entries: PgStore::entries(&rows)?,
            at: at.max(0) as u64,
        })
    }

    async fn leave(&self, key: &str, owner: &Owner) -> EngineResult<Presence> {
        let lock = self.lock(key);
        let args = [
            Arg::Text(&lock),
            Arg::Text(owner.as_str()),
            Arg::Int(self.lock_wait_ms()),
        ];
        let rows = self.rows(&self.sql.leave, &args).await?;
        let found: i32 = rows
            .first()
            .ok_or_else(|| EngineFailure::ambiguous("leave answered no row"))?
            .try_get(0)
            .map_err(EngineFailure::ambiguous)?;
        Ok(Presence::from_code(found.into()))
    }

    async fn renew(&self, batch: &[Renewal<'_>]) -> EngineResult<Vec<Option<Presence>>> {
        let keys: Vec<String> = batch.iter().map(|renewal| self.lock(renewal.key)).collect();
        let owners: Vec<String> = batch
            .iter()
            .map(|renewal| renewal.owner.as_str().to_owned())
            .collect();
        let ttls: Vec<i64> = batch
            .iter()
            .map(|renewal| renewal.ttl.as_millis().max(1) as i64)
            .collect();
        let args = [Arg::Texts(&keys), Arg::Texts(&owners), Arg::Ints(&ttls)];
        let rows = self.rows(&self.sql.renew, &args).await?;
        rows.iter()
            .map(|row| {
                let found: i32 = row.try_get(0).map_err(EngineFailure::ambiguous)?;
                Ok(Some(Presence::from_code(found.into())))
            })
            .collect()
    }

    async fn read(&self, key: &str) -> EngineResult<Vec<Entry<Duration>>> {
        let lock = self.lock(key);
        let rows = self.rows(&self.sql.read, &[Arg::Text(&lock)]).await?;
        PgStore::entries(&rows)
    }

    async fn remove(&self, key: &str, entry: &Entry<Duration>) -> EngineResult<bool> {
        let lock = self.lock(key);
        let args = [
            Arg::Text(&lock),
            Arg::Text(&entry.owner),
            Arg::Int(entry.token as i64),
            Arg::Int(self.lock_wait_ms()),
        ];
        let rows = self.rows(&self.sql.remove, &args).await?;
        rows.first()
            .ok_or_else(|| EngineFailure::ambiguous("remove answered no row"))?
            .try_get(0)
            .map_err(EngineFailure::ambiguous)
    }

    /// The time left when the entry was read: counted on the database's clock.
    async fn time_left(&self, _key: &str, entry: &Entry<Duration>) -> Option<Duration> {
        Some(entry.lease)
    }

    async fn deletions(&self, key: &str) -> EngineResult<Deletions> {
        let changes = self.listener.follow(&self.lock(key)).await?;
        let deleted = tokio_stream_of(changes).filter_map(|change| async move {
            (change.op == Op::Deleted).then_some(Deletion {
                owner: change.owner,
                at: change.xid,
            })
        });
        Ok(deleted.boxed())
    }

    async fn keys(&self) -> EngineResult<Vec<String>> {
        let start = format!("{}:{{", self.prefix);
        let rows = self.rows(&self.sql.keys, &[Arg::Text(&start)]).await?;
        let locks = rows
            .iter()
            .map(|row| row.try_get::<String, _>(0))
            .collect::<Result<Vec<_>, _>>()
            .map_err(EngineFailure::ambiguous)?;
        Ok(keys_of(&self.prefix, &locks))
    }

    /// Every change of the key's queue, as `put` (a join, a renewal) and `delete`.
    async fn follow(&self, key: &str, events: KeyEventSender) -> EngineResult<()> {
        let mut changes = self.listener.follow(&self.lock(key)).await?;
        let server = self.connection.describe().to_owned();
        tokio::spawn(async move {
            loop {
                let change = tokio::select! {
                    () = events.closed() => return,
                    change = changes.recv() => change,
                };
                let Some(change) = change else {
                    let reason = "the notification connection to PostgreSQL ended".to_owned();
                    events.send(KeyEvent::Interrupted { server, reason });
                    return;
                };
                let event = match change.op {
                    Op::Joined | Op::Renewed => "put",
                    Op::Deleted => "delete",
                };
                let notified = KeyEvent::Notified {
                    server: server.clone(),
                    event: event.to_owned(),
                };
                if !events.send(notified) {
                    return;
                }
            }
        });
        Ok(())
    }

    async fn doctor(&self) -> EngineResult<Vec<Finding>> {
        let mut findings = Vec::new();
        for (name, setting) in self.settings().await? {
            let advice = match (name.as_str(), setting.as_str()) {
                ("fsync", "off") => {
                    "fsync is off: a crash of the database server can lose \
                                     grants it acknowledged, and a lock can be granted twice; \
                                     turn it on for a lock that guards data"
                }
                ("synchronous_commit", "off") => {
                    "synchronous_commit is off: a crash can lose \
                                                  the last grants the server acknowledged; set \
                                                  it to on (or remote_apply with a standby)"
                }
                ("in_recovery", "true") => {
                    "the server is a standby: no lock can be taken on \
                                            it; point the backend at the primary"
                }
                _ => continue,
            };
            let check = match name.as_str() {
                "in_recovery" => Check::Standby,
                _ => Check::Persistence,
            };
            findings.push(Finding {
                check,
                advice: advice.into(),
            });
        }
        Ok(findings)
    }

    fn close(&self) {
        self.listener.close();
    }

    fn sql_schema(&self) -> Option<&str> {
        Some(self.schema())
    }
}

/// A receiver as a stream.
fn tokio_stream_of<T: Send + 'static>(
    mut receiver: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures_util::Stream<Item = T> + Send {
    futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}
