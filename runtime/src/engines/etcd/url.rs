//! An `etcd://` or `etcds://` URL, parsed: the cluster's endpoints, whether they speak TLS, and
//! the user's credentials.

use crate::error::LockError;
use crate::util::hosts::{split_scheme, Authority};
use crate::util::redact::redact_url;

/// The client port of an etcd member when a URL names none.
pub(crate) const ETCD_PORT: u16 = 2379;

/// The members to connect to (the client balances over them and moves on when one fails) and
/// the user's credentials, when the cluster has authentication on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EtcdSpec {
    pub(crate) endpoints: Vec<(String, u16)>,
    /// `etcds://`: TLS to every member (mutual TLS when a client certificate is set).
    pub(crate) secure: bool,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
}

impl EtcdSpec {
    /// Parses `etcd[s]://[user:password@]host[:port][,host[:port]…]` (no path, no query).
    pub(crate) fn parse(url: &str) -> Result<EtcdSpec, LockError> {
        let problem = |what: String| {
            LockError::invalid_config(
                "url",
                format!(
                    "`{}` {what}; expected etcd[s]://[user:password@]host:2379[,host:2379…]",
                    redact_url(url)
                ),
            )
        };
        let (rest, secure) = split_scheme(url, "etcd", "etcds")
            .ok_or_else(|| problem("is not an etcd:// or etcds:// URL".into()))?
            .map_err(problem)?;
        let authority = rest.trim_end_matches('/');
        if let Some(extra) = authority.find(['/', '?']) {
            return Err(problem(format!(
                "has `{}` after the members; an etcd URL names members only (give the \
                 namespace with `prefix`)",
                &authority[extra..]
            )));
        }
        let Authority {
            username,
            password,
            hosts,
        } = Authority::parse(authority, ETCD_PORT, "member", &problem)?;
        if username.is_some() != password.is_some() {
            return Err(problem(
                "gives a user without a password (or the reverse); etcd authenticates with both"
                    .into(),
            ));
        }
        Ok(EtcdSpec {
            endpoints: hosts,
            secure,
            username,
            password,
        })
    }

    /// `http[s]://host:port` of each member, as the client dials them.
    pub(crate) fn endpoints(&self) -> Vec<String> {
        let scheme = match self.secure {
            true => "https",
            false => "http",
        };
        self.endpoints
            .iter()
            .map(|(host, port)| match host.contains(':') {
                true => format!("{scheme}://[{host}]:{port}"),
                false => format!("{scheme}://{host}:{port}"),
            })
            .collect()
    }

    /// `the etcd cluster of members host:port,…`, for messages.
    pub(crate) fn describe(&self) -> String {
        let members: Vec<String> = self
            .endpoints
            .iter()
            .map(|(host, port)| format!("{host}:{port}"))
            .collect();
        let tls = match self.secure {
            true => " (TLS)",
            false => "",
        };
        format!("the etcd cluster of members {}{tls}", members.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_etcd_url_names_members_and_credentials() {
        let spec = EtcdSpec::parse("etcd://root:s%40cret@10.0.0.1,10.0.0.2:2479/").unwrap();
        assert_eq!(
            spec.endpoints,
            [("10.0.0.1".to_owned(), 2379), ("10.0.0.2".to_owned(), 2479)]
        );
        assert_eq!(spec.username.as_deref(), Some("root"));
        assert_eq!(spec.password.as_deref(), Some("s@cret"));
        assert_eq!(
            spec.endpoints(),
            ["http://10.0.0.1:2379", "http://10.0.0.2:2479"]
        );
    }

    #[cfg(feature = "tls")]
    #[test]
    fn an_etcds_url_dials_every_member_over_tls() {
        let spec = EtcdSpec::parse("etcds://h1,h2:2479").unwrap();
        assert!(spec.secure);
        assert_eq!(spec.endpoints(), ["https://h1:2379", "https://h2:2479"]);
        assert!(spec.describe().ends_with("(TLS)"), "{}", spec.describe());
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn an_etcds_url_needs_the_tls_feature() {
        let err = EtcdSpec::parse("etcds://h1").unwrap_err().to_string();
        assert!(err.contains("enable the `tls` feature"), "{err}");
    }

    #[test]
    fn a_bad_etcd_url_is_named() {
        let err = |url: &str| EtcdSpec::parse(url).unwrap_err().to_string();
        assert!(
            err("etcd://h:1/ns").contains("after the members"),
            "{}",
            err("etcd://h:1/ns")
        );
        let lone = err("etcd://root@h");
        assert!(lone.contains("without a password"), "{lone}");
        assert!(
            err("etcd://h:port").contains("as a port"),
            "{}",
            err("etcd://h:port")
        );
        let secret = err("etcd://root:hunter2@h/x");
        assert!(!secret.contains("hunter2"), "{secret}");
    }
}
