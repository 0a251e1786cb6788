//! The session with a ZooKeeper ensemble: made on first use (inside the runtime that uses the
//! backend), made again once ZooKeeper ends it (every ephemeral node of the old one is gone
//! then), each request bounded by the response timeout.

use super::url::ZkSpec;
use crate::engines::engine::{EngineFailure, EngineResult};
use crate::engines::settings::Timeouts;
use crate::util::advised::Advised;
use std::future::Future;
use std::time::{Duration, Instant};
use zookeeper_client as zk;

pub(crate) struct Connection {
    spec: ZkSpec,
    /// The session timeout asked for; the ensemble may grant another.
    session_timeout: Duration,
    timeouts: Timeouts,
    client: tokio::sync::Mutex<Option<zk::Client>>,
    /// When the last attempt to open a session failed, and why: the calls that waited for it
    /// fail at once rather than each trying again in turn.
    failed: std::sync::Mutex<Option<(Instant, String)>>,
}

impl Connection {
    pub(crate) fn new(spec: ZkSpec, session_timeout: Duration, timeouts: Timeouts) -> Connection {
        Connection {
            spec,
            session_timeout,
            timeouts,
            client: tokio::sync::Mutex::new(None),
            failed: std::sync::Mutex::new(None),
        }
    }

    pub(crate) fn spec(&self) -> &ZkSpec {
        &self.spec
    }

    /// The client of the live session, made on first use and again once the session ended;
    /// within a connect timeout of a failed attempt, that attempt's failure.
    ///
    /// # Cancel safety
    /// Cancel safe: a session dropped half-made is made again by the next call.
    pub(crate) async fn client(&self) -> EngineResult<zk::Client> {
        let asked = Instant::now();
        let mut current = self.client.lock().await;
        if let Some(client) = current.as_ref().filter(|c| !c.state().is_terminated()) {
            return Ok(client.clone());
        }
        let failed = self
            .failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some((_, why)) =
            failed.filter(|(at, _)| asked.duration_since(*at) < self.timeouts.connect)
        {
            return Err(EngineFailure {
                ambiguous: false,
                source: why.into(),
            });
        }
        match self.connect().await {
            Ok(client) => {
                *current = Some(client.clone());
                Ok(client)
            }
            Err(failure) => {
                let why = failure.source.to_string();
                *self.failed.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((Instant::now(), why));
                Err(failure)
            }
        }
    }

    /// A new session, with the credentials of the URL.
    ///
    /// # Cancel safety
    /// Cancel safe: a session half-made is dropped with its client, and the next call makes one.
    async fn connect(&self) -> EngineResult<zk::Client> {
        let mut connector = zk::Client::connector()
            .with_session_timeout(self.session_timeout)
            .with_connection_timeout(self.timeouts.connect);
        if let (Some(user), Some(password)) = (&self.spec.username, &self.spec.password) {
            connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
        }
        // Every server may be tried in turn before one grants the session.
        let budget = self.timeouts.connect * (self.spec.servers.len() as u32).max(1);
        match tokio::time::timeout(budget, connector.connect(&self.spec.connect_string())).await {
            // Nothing was sent: a session that was not made carried no request.
            Ok(connected) => connected.map_err(|err| EngineFailure {
                ambiguous: false,
                ..self.failure(err)
            }),
            Err(_) => Err(EngineFailure {
                ambiguous: false,
                source: format!(
                    "could not open a ZooKeeper session: no server of {} granted one within \
                     {}",
                    self.spec.describe(),
                    humantime::format_duration(budget)
                )
                .into(),
            }),
        }
    }

    /// Waits for one request (or several sent together), bounded by the response timeout; one
    /// that timed out or broke may have been applied (ambiguous).
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// Like a lost reply: a request already sent may still be applied. Callers treat both alike
    /// (see [`Engine`](crate::engines::engine::Engine)).
    pub(crate) async fn within<T>(
        &self,
        request: impl Future<Output = Result<T, zk::Error>>,
    ) -> EngineResult<T> {
        match tokio::time::timeout(self.timeouts.response, request).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(err)) => Err(self.failure(err)),
            Err(_) => Err(EngineFailure::ambiguous("ZooKeeper did not answer in time")),
        }
    }

    /// A request that failed: ambiguous unless ZooKeeper refused it, with advice for the causes
    /// a user can fix.
    pub(crate) fn failure(&self, err: zk::Error) -> EngineFailure {
        let advice = match &err {
            zk::Error::NoAuth | zk::Error::InvalidAcl => Some(
                "the ZooKeeper user lacks a permission distlock needs on its nodes: \
                 create, read, write and delete under the backend's prefix"
                    .to_owned(),
            ),
            zk::Error::AuthFailed => Some(
                "ZooKeeper rejected the credentials; check the user name and password in the \
                 URL (digest authentication)"
                    .to_owned(),
            ),
            zk::Error::NotReadOnly => Some(
                "the server answering is read-only (it lost its quorum): no lock can be taken \
                 or released until a majority of the ensemble is back"
                    .to_owned(),
            ),
            _ => None,
        };
        let ambiguous = advice.is_none() && !matches!(err, zk::Error::BadArguments(_));
        let source: Box<dyn std::error::Error + Send + Sync> = match advice {
            Some(advice) => Box::new(Advised { error: err, advice }),
            None => Box::new(err),
        };
        EngineFailure { ambiguous, source }
    }
}

/// Whether ZooKeeper answered that the node is there already.
pub(super) fn node_exists(failure: &EngineFailure) -> bool {
    failure
        .source
        .downcast_ref::<zk::Error>()
        .is_some_and(|err| matches!(err, zk::Error::NodeExists))
}

/// Whether ZooKeeper answered that the node is not there.
pub(super) fn no_node(failure: &EngineFailure) -> bool {
    failure
        .source
        .downcast_ref::<zk::Error>()
        .is_some_and(|err| matches!(err, zk::Error::NoNode))
}
