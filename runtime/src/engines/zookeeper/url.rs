//! A `zookeeper://` URL, parsed: the ensemble's servers, the chroot every path is under, the
//! session timeout to ask for, and the digest credentials.

use crate::error::LockError;
use crate::util::hosts::{percent_decode, Authority};
use crate::util::redact::redact_url;
use std::time::Duration;

/// The client port of a ZooKeeper server when a URL names none.
pub(crate) const ZOOKEEPER_PORT: u16 = 2181;

/// The servers to connect to (the client moves on when one fails), where the locks live, and
/// the session to ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ZkSpec {
    pub(crate) servers: Vec<(String, u16)>,
    /// The path every node is under (`/` when none is given).
    pub(crate) chroot: String,
    /// The session timeout to ask for; `None`: the backend's watchdog lease.
    pub(crate) session_timeout: Option<Duration>,
    /// `digest` credentials, sent after the session is made.
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
}

impl ZkSpec {
    /// Parses `zookeeper://[user:password@]host[:port][,host[:port]…][/chroot]
    /// [?session_timeout=30s]`.
    pub(crate) fn parse(url: &str) -> Result<ZkSpec, LockError> {
        let problem = |what: String| {
            LockError::invalid_config(
                "url",
                format!(
                    "`{}` {what}; expected zookeeper://[user:password@]host:2181[,host:2181…]\
                     [/chroot][?session_timeout=30s]",
                    redact_url(url)
                ),
            )
        };
        let Some(rest) = url.strip_prefix("zookeeper://") else {
            return Err(problem("is not a zookeeper:// URL".into()));
        };
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, chroot) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, "/"),
        };
        let chroot = chroot_of(chroot).map_err(problem)?;
        let Authority {
            username,
            password,
            hosts,
        } = Authority::parse(authority, ZOOKEEPER_PORT, "server", &problem)?;
        if username.is_some() != password.is_some() {
            return Err(problem(
                "gives a user without a password (or the reverse); ZooKeeper's digest \
                 authentication takes both"
                    .into(),
            ));
        }
        let session_timeout = match query {
            None => None,
            Some(query) => Some(session_timeout(query).map_err(problem)?),
        };
        Ok(ZkSpec {
            servers: hosts,
            chroot,
            session_timeout,
            username,
            password,
        })
    }

    /// `host:port,…` and the chroot, as the client takes them.
    pub(crate) fn connect_string(&self) -> String {
        let servers: Vec<String> = self
            .servers
            .iter()
            .map(|(host, port)| match host.contains(':') {
                true => format!("[{host}]:{port}"),
                false => format!("{host}:{port}"),
            })
            .collect();
        let chroot = match self.chroot.as_str() {
            "/" => "",
            chroot => chroot,
        };
        format!("{}{chroot}", servers.join(","))
    }

    /// `the ZooKeeper ensemble of servers host:port,…`, for messages.
    pub(crate) fn describe(&self) -> String {
        let servers: Vec<String> = self
            .servers
            .iter()
            .map(|(host, port)| format!("{host}:{port}"))
            .collect();
        let chroot = match self.chroot.as_str() {
            "/" => String::new(),
            chroot => format!(" under {chroot}"),
        };
        format!(
            "the ZooKeeper ensemble of servers {}{chroot}",
            servers.join(",")
        )
    }
}

/// The chroot a URL's path names: `/a/b`, decoded, without a trailing `/`.
fn chroot_of(path: &str) -> Result<String, String> {
    let path = percent_decode(path).ok_or("holds a malformed percent-escape in its path")?;
    let trimmed = match path.trim_end_matches('/') {
        "" => return Ok("/".into()),
        trimmed => trimmed,
    };
    for part in trimmed.split('/').skip(1) {
        if part.is_empty() || part == "." || part == ".." || part.chars().any(char::is_control) {
            return Err(format!(
                "has the chroot `{trimmed}`, which is not a ZooKeeper path (an empty, `.` or \
                 `..` part, or a control character)"
            ));
        }
    }
    Ok(trimmed.to_owned())
}

/// The `session_timeout` of a URL's query, the only parameter it takes.
fn session_timeout(query: &str) -> Result<Duration, String> {
    let mut timeout = None;
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        match pair.split_once('=') {
            Some(("session_timeout", value)) => {
                let parsed = humantime::parse_duration(value).map_err(|err| {
                    format!("has session_timeout=`{value}`, which is not a duration ({err})")
                })?;
                if parsed < Duration::from_millis(100) {
                    return Err(format!(
                        "has session_timeout=`{value}`; a session shorter than 100ms expires \
                         between the client's pings"
                    ));
                }
                timeout = Some(parsed);
            }
            _ => {
                return Err(format!(
                    "has `{pair}` in its query; a ZooKeeper URL takes session_timeout=<duration> \
                     only"
                ))
            }
        }
    }
    timeout.ok_or_else(|| "has an empty query".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zookeeper_url_names_servers_chroot_and_session() {
        let spec = ZkSpec::parse(
            "zookeeper://app:s%40cret@10.0.0.1,10.0.0.2:2182/locks/billing/?session_timeout=20s",
        )
        .unwrap();
        assert_eq!(
            spec.servers,
            [("10.0.0.1".to_owned(), 2181), ("10.0.0.2".to_owned(), 2182)]
        );
        assert_eq!(spec.chroot, "/locks/billing");
        assert_eq!(spec.session_timeout, Some(Duration::from_secs(20)));
        assert_eq!(spec.password.as_deref(), Some("s@cret"));
        assert_eq!(
            spec.connect_string(),
            "10.0.0.1:2181,10.0.0.2:2182/locks/billing"
        );
        let plain = ZkSpec::parse("zookeeper://h").unwrap();
        assert_eq!((plain.chroot.as_str(), plain.session_timeout), ("/", None));
        assert_eq!(plain.connect_string(), "h:2181");
    }

    #[test]
    fn a_bad_zookeeper_url_is_named() {
        let err = |url: &str| ZkSpec::parse(url).unwrap_err().to_string();
        assert!(err("zookeeper://h/a//b").contains("not a ZooKeeper path"));
        assert!(err("zookeeper://h/a/..").contains("not a ZooKeeper path"));
        assert!(err("zookeeper://h?ttl=3").contains("takes session_timeout=<duration> only"));
        assert!(err("zookeeper://h?session_timeout=soon").contains("not a duration"));
        assert!(err("zookeeper://h?session_timeout=5ms").contains("shorter than 100ms"));
        assert!(err("zookeeper://app@h").contains("without a password"));
        let secret = err("zookeeper://app:hunter2@h:port");
        assert!(
            secret.contains("as a port") && !secret.contains("hunter2"),
            "{secret}"
        );
    }
}
