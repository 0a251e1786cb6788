//! The etcd fixtures: a 3-member etcd cluster on loopback (plain, or TLS only with client
//! certificates), and waiting on its events.

use super::{Fixture, PREFIX};
use distlock::{Backend, BackendBuilder};
use distlock_test_support::{EtcdCluster, RedisServer, TestPki};
use etcd_client::WatchOptions;
use etcd_client::{Certificate, Client, ConnectOptions, GetOptions, Identity, TlsOptions};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// The etcd backend on a 3-member cluster; `TLS`: `etcds://`, the members serving clients over
/// TLS only and admitting only clients with a certificate signed by the test CA.
pub struct EtcdOf<const TLS: bool> {
    pub cluster: EtcdCluster,
    backend: Backend,
    builder: BackendBuilder,
    /// The certificates of a TLS cluster, removed with the fixture.
    _pki: Option<TestPki>,
}

/// A plain etcd cluster.
pub type Etcd = EtcdOf<false>;
/// An etcd cluster that serves clients over mutual TLS only.
pub type EtcdTls = EtcdOf<true>;

impl<const TLS: bool> EtcdOf<TLS> {
    /// A client of the cluster, for what the tests read behind the backend's back.
    pub async fn client(&self) -> Client {
        connect(&self.cluster).await
    }
}

/// A client of `cluster`, with the client certificate of a TLS cluster.
pub async fn connect(cluster: &EtcdCluster) -> Client {
    let options = cluster.client_tls().map(|(ca, cert, key)| {
        let read = |path| std::fs::read(path).unwrap();
        let tls = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(read(ca)))
            .identity(Identity::from_pem(read(cert), read(key)));
        ConnectOptions::new().with_tls(tls)
    });
    Client::connect(cluster.client_urls(), options)
        .await
        .expect("the cluster answers")
}

impl<const TLS: bool> Fixture for EtcdOf<TLS> {
    fn start(configure: impl FnOnce(BackendBuilder) -> BackendBuilder) -> Self {
        let pki = TLS.then(TestPki::generate);
        let (cluster, base) = match &pki {
            Some(pki) => {
                let cluster = EtcdCluster::start_tls(3, pki);
                let base = Backend::builder(cluster.url())
                    .tls_ca_file(pki.ca())
                    .tls_client_auth_files(pki.client_cert(), pki.client_key());
                (cluster, base)
            }
            None => {
                let cluster = EtcdCluster::start(3);
                let base = Backend::builder(cluster.url());
                (cluster, base)
            }
        };
        let builder = configure(base.prefix(PREFIX));
        EtcdOf {
            backend: builder.clone().build().expect("valid settings"),
            builder,
            cluster,
            _pki: pki,
        }
    }

    fn backend(&self) -> &Backend {
        &self.backend
    }

    /// etcd keeps no token marker: the revision a token is taken from never goes back.
    async fn forget_token_marker(&self, _key: &str) {}

    /// The time left of the holder's lease, in etcd's whole seconds.
    async fn pttl(&self, key: &str) -> Option<Duration> {
        let holder = self.backend.inspect(key).await.unwrap()?;
        Some(holder.ttl)
    }

    fn contender(&self) -> Backend {
        self.builder.clone().build().unwrap()
    }

    /// Keys among `candidates` with any entry left in their queue: a holder, or a waiter,
    /// which would hold up everyone behind it.
    async fn held_keys(&self, candidates: &[String]) -> Vec<String> {
        let mut client = self.client().await;
        let start = format!("{PREFIX}:{{");
        let options = GetOptions::new().with_prefix().with_keys_only();
        let read = client.get(start.as_str(), Some(options)).await.unwrap();
        let queued: BTreeSet<&str> = read
            .kvs()
            .iter()
            .filter_map(|kv| {
                let name = std::str::from_utf8(kv.key()).ok()?.strip_prefix(&start)?;
                Some(name.split_once("}/")?.0)
            })
            .collect();
        let held: BTreeSet<&String> = candidates
            .iter()
            .filter(|key| queued.contains(key.as_str()))
            .collect();
        held.into_iter().cloned().collect()
    }

    fn kind(&self) -> &'static str {
        match TLS {
            true => "etcd over TLS",
            false => "etcd",
        }
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

    fn held_for(&self, ttl: Duration) -> Duration {
        let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        Duration::from_secs(seconds + 1) + Duration::from_millis(500)
    }

    fn etcd(&self) -> Option<&EtcdCluster> {
        Some(&self.cluster)
    }
}

/// Waits up to `within` until `check` holds, re-checked at every change of any key on
/// `cluster` (a lease that ends deletes its keys: that is a change too).
pub async fn until_on_etcd(
    cluster: &EtcdCluster,
    within: Duration,
    mut check: impl AsyncFnMut() -> bool,
) -> bool {
    let deadline = Instant::now() + within;
    let client = connect(cluster).await;
    let mut stream = client
        .watch_client()
        .watch("\0", Some(WatchOptions::new().with_from_key()))
        .await
        .unwrap();
    // Created before the first check: no change after it is missed.
    stream.message().await.unwrap();
    loop {
        if check().await {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.message()).await {
            Ok(Ok(Some(_))) => {}
            Ok(_) => panic!("the test's etcd watch ended"),
            Err(_) => return check().await,
        }
    }
}
