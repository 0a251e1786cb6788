//! The connection to an etcd cluster: opened on first use (inside the runtime that uses the
//! backend), balanced over the members, each request bounded by the response timeout.

use super::url::EtcdSpec;
use crate::engines::engine::{EngineFailure, EngineResult};
use crate::engines::settings::Timeouts;
use etcd_client::{Client, ConnectOptions};
use std::future::Future;
use tonic::Code;

pub(crate) struct Connection {
    spec: EtcdSpec,
    timeouts: Timeouts,
    client: tokio::sync::OnceCell<Client>,
}

impl Connection {
    pub(crate) fn new(spec: EtcdSpec, timeouts: Timeouts) -> Connection {
        Connection {
            spec,
            timeouts,
            client: tokio::sync::OnceCell::new(),
        }
    }

    pub(crate) fn spec(&self) -> &EtcdSpec {
        &self.spec
    }

    /// The client, connected on first use.
    ///
    /// # Cancel safety
    /// Cancel safe: a connection dropped half-made is made again by the next call.
    pub(crate) async fn client(&self) -> EngineResult<Client> {
        let client = self
            .client
            .get_or_try_init(|| async {
                let mut options = ConnectOptions::new()
                    .with_connect_timeout(self.timeouts.connect)
                    .with_keep_alive(
                        self.timeouts.response.max(self.timeouts.connect),
                        self.timeouts.connect,
                    )
                    .with_keep_alive_while_idle(true);
                if let (Some(user), Some(password)) = (&self.spec.username, &self.spec.password) {
                    options = options.with_user(user.clone(), password.clone());
                }
                let connecting = Client::connect(self.spec.endpoints(), Some(options));
                match tokio::time::timeout(self.timeouts.connect, connecting).await {
                    Ok(connected) => connected.map_err(refused),
                    Err(_) => Err(refused("no member answered in time")),
                }
            })
            .await?;
        Ok(client.clone())
    }

    /// Runs one request, bounded by the response timeout; a request that timed out or broke
    /// may have been applied (ambiguous).
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// Like a lost reply: a request already sent may still be applied. Callers treat both alike
    /// (see [`Engine`](crate::engines::engine::Engine)).
    pub(crate) async fn call<T, F>(&self, request: impl FnOnce(Client) -> F) -> EngineResult<T>
    where
        F: Future<Output = Result<T, etcd_client::Error>>,
    {
        let client = self.client().await?;
        match tokio::time::timeout(self.timeouts.response, request(client)).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(err)) => Err(failed(err)),
            Err(_) => Err(EngineFailure::ambiguous("etcd did not answer in time")),
        }
    }
}

/// A request that failed: ambiguous unless etcd said it refused it.
fn failed(err: etcd_client::Error) -> EngineFailure {
    let refused_outright = matches!(
        &err,
        etcd_client::Error::GRpcStatus(status) if matches!(
            status.code(),
            Code::PermissionDenied
                | Code::Unauthenticated
                | Code::InvalidArgument
                | Code::FailedPrecondition
        )
    );
    EngineFailure {
        ambiguous: !refused_outright,
        source: Box::new(err),
    }
}

/// The connection could not be made: nothing was sent.
fn refused(err: impl std::fmt::Display) -> EngineFailure {
    EngineFailure {
        ambiguous: false,
        source: format!("could not connect to etcd: {err}").into(),
    }
}
