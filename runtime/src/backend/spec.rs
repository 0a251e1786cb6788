//! [`EngineSpec`]: which deployment a builder builds, read once — from a URL
//! ([`Backend::builder`](crate::Backend::builder), `DISTLOCK_URL`) or from the typed constructors
//! ([`Backend::sentinel`](crate::Backend::sentinel), [`cluster`](crate::Backend::cluster),
//! [`redlock`](crate::Backend::redlock)), which build it directly instead of writing a URL.

#[cfg(feature = "etcd")]
use crate::engines::etcd::spec::{EtcdSpec, ETCD_PORT};
use crate::engines::redis::cluster_spec::{ClusterSpec, NODE_PORT};
use crate::engines::redis::sentinel::{SentinelSpec, SENTINEL_PORT};
use crate::error::LockError;
use crate::util::hosts::Authority;
use crate::util::redact::redact_url;

/// A deployment and where it is.
#[derive(Debug, Clone)]
pub(crate) enum EngineSpec {
    /// `memory://`: the in-process engine.
    InProcess,
    /// One server: `redis://`, `rediss://`, `unix://` or `redis+unix://`.
    Server { url: String },
    /// The primary a Sentinel group names, followed across failovers.
    Sentinel(SentinelSpec),
    /// A Redis Cluster, from seed nodes.
    Cluster(ClusterSpec),
    /// Redlock over independent masters (at least 3), each a full server URL.
    Redlock { masters: Vec<String> },
    /// An etcd cluster (feature `etcd`).
    #[cfg(feature = "etcd")]
    Etcd(EtcdSpec),
}

/// The schemes of one server's URL (also what each Redlock master must be).
const SERVER_SCHEMES: [&str; 4] = ["redis", "rediss", "unix", "redis+unix"];

impl EngineSpec {
    /// The deployment `url` names: one URL, or three or more comma-separated server URLs.
    pub(crate) fn from_url(url: &str) -> Result<EngineSpec, LockError> {
        let masters = masters(url);
        if masters.len() > 1 {
            return EngineSpec::redlock(masters);
        }
        match scheme(url) {
            Some("memory") => Ok(EngineSpec::InProcess),
            Some("redis-sentinel") => SentinelSpec::parse(url).map(EngineSpec::Sentinel),
            Some("redis-cluster") => ClusterSpec::parse(url).map(EngineSpec::Cluster),
            #[cfg(feature = "etcd")]
            Some("etcd") => EtcdSpec::parse(url).map(EngineSpec::Etcd),
            #[cfg(not(feature = "etcd"))]
            Some("etcd") => Err(LockError::invalid_config(
                "url",
                format!(
                    "`{}` is an etcd cluster, and this build of distlock has no etcd engine; \
                     turn on distlock's `etcd` feature",
                    redact_url(url)
                ),
            )),
            Some(scheme) if SERVER_SCHEMES.contains(&scheme) => Ok(EngineSpec::Server {
                url: url.to_owned(),
            }),
            _ => Err(LockError::invalid_config(
                "url",
                format!(
                    "`{}` is not a lock backend URL; expected redis://host:port, rediss://host:port, \
                     unix:///path/to/socket, redis-sentinel://host:port,…/MASTER_NAME, \
                     redis-cluster://host:port,…, etcd://host:port,…, memory://, or three or more \
                     comma-separated redis:// URLs for Redlock",
                    redact_url(url)
                ),
            )),
        }
    }

    /// The primary `master_name` names, found by asking `sentinels` (`host[:port]`, port 26379
    /// by default).
    pub(crate) fn sentinel(
        sentinels: Vec<String>,
        master_name: &str,
    ) -> Result<EngineSpec, LockError> {
        if master_name.is_empty() {
            return Err(LockError::invalid_config(
                "master_name",
                "is empty; give the name the sentinels monitor the primary under",
            ));
        }
        Ok(EngineSpec::Sentinel(SentinelSpec {
            sentinels: hosts("sentinels", &sentinels, SENTINEL_PORT)?,
            master_name: master_name.to_owned(),
            db: 0,
            username: None,
            password: None,
            sentinel_username: None,
            sentinel_password: None,
        }))
    }

    /// A cluster found from `nodes` (`host[:port]`, port 6379 by default).
    pub(crate) fn cluster(nodes: Vec<String>) -> Result<EngineSpec, LockError> {
        Ok(EngineSpec::Cluster(ClusterSpec {
            seeds: hosts("nodes", &nodes, NODE_PORT)?,
            username: None,
            password: None,
        }))
    }

    /// The etcd cluster of `members` (`host[:port]`, port 2379 by default).
    #[cfg(feature = "etcd")]
    pub(crate) fn etcd(members: Vec<String>) -> Result<EngineSpec, LockError> {
        Ok(EngineSpec::Etcd(EtcdSpec {
            endpoints: hosts("members", &members, ETCD_PORT)?,
            username: None,
            password: None,
        }))
    }

    /// Redlock over `masters`: at least 3, each a server URL.
    pub(crate) fn redlock(masters: Vec<String>) -> Result<EngineSpec, LockError> {
        let listed = || redacted_list(&masters);
        if masters.len() < 3 {
            return Err(LockError::invalid_config(
                "url",
                format!(
                    "`{}` lists {} masters; Redlock needs at least 3 independent masters (3 or 5 \
                     are the useful sizes), or give one URL for a single server",
                    listed(),
                    masters.len()
                ),
            ));
        }
        let not_a_server =
            |url: &&String| !scheme(url).is_some_and(|s| SERVER_SCHEMES.contains(&s));
        if let Some(bad) = masters.iter().find(not_a_server) {
            return Err(LockError::invalid_config(
                "url",
                format!(
                    "`{}` in `{}` is not a Redis URL; every Redlock master is a full redis:// \
                     or rediss:// URL, with its own credentials",
                    redact_url(bad),
                    listed()
                ),
            ));
        }
        Ok(EngineSpec::Redlock { masters })
    }

    /// What [`Backend::deployment`](crate::Backend::deployment) answers.
    pub(crate) fn deployment(&self) -> &'static str {
        match self {
            EngineSpec::InProcess => "in-process",
            EngineSpec::Server { .. } => "redis",
            EngineSpec::Sentinel(_) => "sentinel",
            EngineSpec::Cluster(_) => "cluster",
            EngineSpec::Redlock { .. } => "redlock",
            #[cfg(feature = "etcd")]
            EngineSpec::Etcd(_) => "etcd",
        }
    }

    /// Where it is, without passwords: for `Debug` and messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            EngineSpec::InProcess => "memory://".into(),
            EngineSpec::Server { url } => redact_url(url),
            EngineSpec::Sentinel(spec) => spec.describe(),
            EngineSpec::Cluster(spec) => spec.describe(),
            EngineSpec::Redlock { masters } => redacted_list(masters),
            #[cfg(feature = "etcd")]
            EngineSpec::Etcd(spec) => spec.describe(),
        }
    }
}

/// Redlock's master URLs without their passwords, comma-separated: for messages.
pub(crate) fn redacted_list(masters: &[String]) -> String {
    let urls: Vec<String> = masters.iter().map(|url| redact_url(url)).collect();
    urls.join(",")
}

/// `host[:port]` items of a typed constructor, parsed (credentials belong in the URL form).
fn hosts(setting: &str, items: &[String], port: u16) -> Result<Vec<(String, u16)>, LockError> {
    let problem = |what: String| LockError::invalid_config(setting, what);
    if items.is_empty() {
        return Err(problem("is empty; give at least one host:port".into()));
    }
    let mut hosts = Vec::with_capacity(items.len());
    for item in items {
        let parsed = Authority::parse(item, port, "host", &problem)?;
        if parsed.username.is_some() || parsed.password.is_some() || parsed.hosts.len() != 1 {
            return Err(problem(format!(
                "holds `{}`, which is not one host[:port]; credentials go in the URL form \
                 (Backend::builder)",
                redact_url(&format!("x://{item}")).trim_start_matches("x://")
            )));
        }
        hosts.extend(parsed.hosts);
    }
    Ok(hosts)
}

/// The URLs of a comma-separated list of masters (one URL: itself). A comma splits only where
/// a new URL starts, so a percent-encoded or plain comma inside a password stays put.
fn masters(url: &str) -> Vec<String> {
    let mut masters = Vec::new();
    let mut rest = url.trim();
    loop {
        let next = [
            "redis://",
            "rediss://",
            "unix://",
            "redis+unix://",
            "redis-sentinel://",
            "redis-cluster://",
            "memory://",
        ]
        .iter()
        .filter_map(|scheme| rest.find(&format!(",{scheme}")))
        .min();
        match next {
            Some(at) => {
                masters.push(rest[..at].trim().trim_end_matches(',').to_owned());
                rest = rest[at + 1..].trim_start();
            }
            None => {
                masters.push(rest.trim().trim_end_matches(',').trim().to_owned());
                return masters;
            }
        }
    }
}

fn scheme(url: &str) -> Option<&str> {
    url.split_once("://").map(|(scheme, _)| scheme)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_constructors_build_the_spec_a_url_would() {
        let typed =
            EngineSpec::sentinel(vec!["10.0.0.1".into(), "[::1]:26380".into()], "orders/eu");
        let Ok(EngineSpec::Sentinel(typed)) = typed else {
            panic!("{typed:?}")
        };
        let url = SentinelSpec::parse("redis-sentinel://10.0.0.1,[::1]:26380/orders%2Feu").unwrap();
        assert_eq!(typed, url);
        let Ok(EngineSpec::Cluster(typed)) = EngineSpec::cluster(vec!["a:7000".into(), "b".into()])
        else {
            panic!()
        };
        assert_eq!(
            typed,
            ClusterSpec::parse("redis-cluster://a:7000,b").unwrap()
        );
    }

    #[test]
    fn typed_constructors_name_what_is_wrong() {
        let err = |spec: Result<EngineSpec, LockError>| spec.unwrap_err().to_string();
        assert!(err(EngineSpec::sentinel(vec![], "m")).contains("sentinels is empty"));
        assert!(err(EngineSpec::sentinel(vec!["h".into()], "")).contains("master_name is empty"));
        let credentials = err(EngineSpec::cluster(vec!["u:hunter2@h:1".into()]));
        assert!(
            credentials.contains("credentials go in the URL form"),
            "{credentials}"
        );
        assert!(!credentials.contains("hunter2"), "{credentials}");
        assert!(err(EngineSpec::cluster(vec!["h:port".into()])).contains("as a port"));
        let two = err(EngineSpec::redlock(vec![
            "redis://a".into(),
            "redis://b".into(),
        ]));
        assert!(two.contains("needs at least 3"), "{two}");
    }
}
