//! The connection to an etcd cluster: opened on first use (inside the runtime that uses the
//! backend), balanced over the members, each request bounded by the response timeout. For
//! `etcds://`, over TLS to every member: the CA of `tls_ca_file` (else the web PKI roots), and
//! the client certificate of `tls_client_auth_files` for members that check clients.

use super::url::EtcdSpec;
use crate::engines::engine::{EngineFailure, EngineResult};
use crate::engines::settings::{Timeouts, TlsFiles};
use crate::util::advised::Advised;
use crate::util::tls_advice::{self, chain_mentions, Hints};
use etcd_client::{Client, ConnectOptions};
use std::future::Future;
use tonic::Code;

pub(crate) struct Connection {
    spec: EtcdSpec,
    tls: TlsFiles,
    /// The backend's prefix, and the start of every key under it (`<prefix>:{`), for advice.
    prefix: String,
    keys: String,
    timeouts: Timeouts,
    client: tokio::sync::OnceCell<Client>,
}

impl Connection {
    pub(crate) fn new(
        spec: EtcdSpec,
        tls: TlsFiles,
        prefix: &str,
        timeouts: Timeouts,
    ) -> Connection {
        Connection {
            spec,
            tls,
            prefix: prefix.to_owned(),
            keys: super::acl::key_prefix(prefix),
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
                if self.spec.secure {
                    options = with_tls(options, &self.tls);
                }
                let connecting = Client::connect(self.spec.endpoints(), Some(options));
                match tokio::time::timeout(self.timeouts.connect, connecting).await {
                    // Nothing was sent: a connection that was not made carried no request.
                    Ok(connected) => connected.map_err(|err| EngineFailure {
                        ambiguous: false,
                        ..self.failure(err)
                    }),
                    Err(_) => Err(EngineFailure {
                        ambiguous: false,
                        source: "could not connect to etcd: no member answered in time".into(),
                    }),
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
            Ok(Err(err)) => Err(self.failure(err)),
            Err(_) => Err(EngineFailure::ambiguous("etcd did not answer in time")),
        }
    }
}

/// `options` with TLS: the CA given (else the web PKI roots), and the client certificate if
/// one is set.
#[cfg(feature = "tls")]
fn with_tls(options: ConnectOptions, tls: &TlsFiles) -> ConnectOptions {
    use etcd_client::{Certificate, Identity, TlsOptions};
    let mut config = TlsOptions::new();
    config = match &tls.ca {
        Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
        None => config.with_webpki_roots(),
    };
    if let Some((cert, key)) = &tls.client {
        config = config.identity(Identity::from_pem(cert, key));
    }
    options.with_tls(config)
}

#[cfg(not(feature = "tls"))]
fn with_tls(_options: ConnectOptions, _tls: &TlsFiles) -> ConnectOptions {
    unreachable!("etcds:// URLs are refused when parsed, without the `tls` feature")
}

impl Connection {
    /// A request that failed: ambiguous unless etcd said it refused it or the TLS handshake
    /// failed (the request never left), with advice for the causes a user can fix.
    pub(crate) fn failure(&self, err: etcd_client::Error) -> EngineFailure {
        let code = match &err {
            etcd_client::Error::GRpcStatus(status) => Some(status.code()),
            _ => None,
        };
        let refused_outright = matches!(
            code,
            Some(
                Code::PermissionDenied
                    | Code::Unauthenticated
                    | Code::InvalidArgument
                    | Code::FailedPrecondition
            )
        );
        let tls = match self.spec.secure {
            true => {
                let plain = "a member without TLS takes the etcd:// scheme";
                tls_advice::advice(&err, &Hints::builder(plain, self.tls.client.is_some()))
            }
            false => None,
        };
        let ambiguous = !refused_outright && tls.is_none();
        let advice = tls.or_else(|| self.advice(&err, code));
        let source: Box<dyn std::error::Error + Send + Sync> = match advice {
            Some(advice) => Box::new(Advised { error: err, advice }),
            None => Box::new(err),
        };
        EngineFailure { ambiguous, source }
    }

    /// What to do about a refused request or a connection the members closed.
    fn advice(&self, err: &etcd_client::Error, code: Option<Code>) -> Option<String> {
        if code == Some(Code::PermissionDenied) {
            return Some(format!(
                "the etcd user lacks a permission distlock needs: read and write on the keys \
                 that start with `{}` (`distlock acl etcd --prefix {}` prints the role to grant)",
                self.keys, self.prefix
            ));
        }
        if chain_mentions(err, "authentication failed") || code == Some(Code::Unauthenticated) {
            return Some(
                "etcd rejected the credentials; check the user name and password in the URL"
                    .to_owned(),
            );
        }
        // etcd-client's message shows the transport's I/O error in its debug form
        // (`Kind(ConnectionReset)`), and its error names no source to follow down to it.
        let closed = ["connection closed", "broken pipe", "connection reset"]
            .into_iter()
            .chain(["brokenpipe", "connectionreset"])
            .any(|needle| chain_mentions(err, needle));
        match (self.spec.secure, closed) {
            (true, true) if self.tls.client.is_none() => Some(
                "the member closed the connection after the TLS handshake, as members that \
                 check client certificates (--client-cert-auth) do with a client that has none; \
                 set `tls_client_auth_files` on the backend builder (or DISTLOCK_TLS_CERT_FILE \
                 and DISTLOCK_TLS_KEY_FILE)"
                    .to_owned(),
            ),
            (false, true) => Some(
                "the member closed the connection at once, as a member serving TLS does with a \
                 plain client; if it serves TLS on this port, use an etcds:// URL"
                    .to_owned(),
            ),
            _ => None,
        }
    }
}
