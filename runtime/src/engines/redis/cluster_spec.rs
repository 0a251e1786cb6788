//! A `redis-cluster://` or `rediss-cluster://` URL, parsed, and the redis-rs cluster clients it
//! makes.

use super::tls;
use crate::engines::settings::{Timeouts, TlsFiles};
use crate::error::LockError;
use crate::util::hosts::{split_scheme, Authority};
use crate::util::redact::redact_url;
use redis::cluster::ClusterClientBuilder;
use redis::IntoConnectionInfo;

/// The port of a cluster node when a URL names none.
pub(crate) const NODE_PORT: u16 = 6379;

/// Seed nodes (one reachable is enough; the others are found from it) and their credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClusterSpec {
    pub(crate) seeds: Vec<(String, u16)>,
    /// `rediss-cluster://`: TLS to every node.
    pub(crate) secure: bool,
    /// The certificates for TLS, set when the engine opens.
    pub(crate) tls: TlsFiles,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
}

impl ClusterSpec {
    /// Parses `redis[s]-cluster://[user:password@]host[:port][,host[:port]…]` (no path, no query:
    /// a cluster has one database).
    pub(crate) fn parse(url: &str) -> Result<ClusterSpec, LockError> {
        let problem = |what: String| {
            LockError::invalid_config(
                "url",
                format!(
                    "`{}` {what}; expected redis[s]-cluster://[user:password@]host:port[,host:port…]",
                    redact_url(url)
                ),
            )
        };
        let (rest, secure) = split_scheme(url, "redis-cluster", "rediss-cluster")
            .ok_or_else(|| problem("is not a redis-cluster:// URL".into()))?
            .map_err(problem)?;
        let authority = rest.trim_end_matches('/');
        if let Some(extra) = authority.find(['/', '?']) {
            return Err(problem(format!(
                "has `{}` after the nodes; a cluster URL names nodes only (a cluster has one \
                 database)",
                &authority[extra..]
            )));
        }
        let Authority {
            username,
            password,
            hosts,
        } = Authority::parse(authority, NODE_PORT, "node", &problem)?;
        Ok(ClusterSpec {
            seeds: hosts,
            secure,
            tls: TlsFiles::default(),
            username,
            password,
        })
    }

    /// `the cluster of nodes host:port,…`, for messages.
    pub(crate) fn describe(&self) -> String {
        let seeds: Vec<String> = self
            .seeds
            .iter()
            .map(|(host, port)| format!("{host}:{port}"))
            .collect();
        format!("the cluster of nodes {}", seeds.join(","))
    }

    /// A client for the single node at `address` (`host:port`, as `CLUSTER SLOTS` names it),
    /// with the cluster's credentials.
    pub(crate) fn node_client(&self, address: &str) -> redis::RedisResult<redis::Client> {
        let (host, port) = address.rsplit_once(':').ok_or_else(|| {
            redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "a cluster node address without a port",
            ))
        })?;
        let port: u16 = port.parse().map_err(|_| {
            redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "a cluster node address with a bad port",
            ))
        })?;
        let mut settings = redis::RedisConnectionInfo::default();
        if let Some(user) = &self.username {
            settings = settings.set_username(user);
        }
        if let Some(pass) = &self.password {
            settings = settings.set_password(pass);
        }
        let host = host.trim_matches(['[', ']']).to_owned();
        let info = tls::address(host, port, self.secure)
            .into_connection_info()?
            .set_redis_settings(settings);
        tls::client_for(info, &self.tls)
    }

    /// A redis-rs cluster client builder for these seeds: credentials for every node, the
    /// connection's timeouts, and quick retries (redirections `MOVED`/`ASK` are retries).
    pub(crate) fn builder(&self, timeouts: Timeouts) -> ClusterClientBuilder {
        let nodes: Vec<String> = self
            .seeds
            .iter()
            .map(|(host, port)| match host.contains(':') {
                true => format!("redis://[{host}]:{port}"),
                false => format!("redis://{host}:{port}"),
            })
            .collect();
        let mut builder = ClusterClientBuilder::new(nodes)
            .connection_timeout(timeouts.connect)
            .response_timeout(timeouts.response)
            .overall_response_timeout(Some(timeouts.response * 4))
            .retries(4)
            .min_retry_wait(10)
            .max_retry_wait(200);
        if let Some(user) = &self.username {
            builder = builder.username(user.clone());
        }
        if let Some(pass) = &self.password {
            builder = builder.password(pass.clone());
        }
        match self.secure {
            true => tls::secure_cluster(builder, &self.tls),
            false => builder,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_nodes_and_credentials() {
        let spec =
            ClusterSpec::parse("redis-cluster://app:p%40ss@10.0.0.1:7000,10.0.0.2,[::1]:7002")
                .unwrap();
        assert_eq!(
            spec.seeds,
            vec![
                ("10.0.0.1".to_owned(), 7000),
                ("10.0.0.2".to_owned(), NODE_PORT),
                ("::1".to_owned(), 7002)
            ]
        );
        assert_eq!(spec.username.as_deref(), Some("app"));
        assert_eq!(spec.password.as_deref(), Some("p@ss"));
        for (url, expected) in [
            ("redis-cluster://a:1/0", "has `/0` after the nodes"),
            ("redis-cluster://a:1?db=1", "has `?db=1` after the nodes"),
            (
                "redis-cluster://a:x",
                "gives `x` as a port for the node `a`",
            ),
            (
                "redis-cluster://:hunter2@a,,b",
                "lists an empty node address",
            ),
        ] {
            let err = ClusterSpec::parse(url).unwrap_err().to_string();
            assert!(err.contains(expected), "{url}: {err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
    }
}
