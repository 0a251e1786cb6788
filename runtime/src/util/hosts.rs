//! The authority of a URL that names several hosts (`redis-sentinel://`, `redis-cluster://`):
//! optional credentials, then a comma-separated list of `host[:port]`.

use crate::error::LockError;
use crate::util::redact::redact_url;

/// Credentials and hosts, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Authority {
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) hosts: Vec<(String, u16)>,
}

impl Authority {
    /// Parses `[user[:password]@]host[:port][,host[:port]…]` (IPv6 hosts in brackets); a host
    /// without a port gets `default_port`. `problem` turns what is wrong into the caller's
    /// error (which names the URL, redacted); `host_kind` names the hosts in it ("sentinel").
    pub(crate) fn parse(
        authority: &str,
        default_port: u16,
        host_kind: &str,
        problem: &dyn Fn(String) -> LockError,
    ) -> Result<Authority, LockError> {
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (user, pass) = match info.split_once(':') {
                    Some((user, pass)) => (user, Some(pass)),
                    None => (info, None),
                };
                let decode = |text: &str| {
                    percent_decode(text).ok_or_else(|| {
                        problem("holds a malformed percent-escape in its credentials".into())
                    })
                };
                let user = Some(decode(user)?).filter(|user| !user.is_empty());
                let pass = pass.map(decode).transpose()?;
                (user, pass)
            }
        };
        let mut parsed = Vec::new();
        for host in hosts.split(',') {
            let host = host.trim();
            if host.is_empty() {
                return Err(problem(format!("lists an empty {host_kind} address")));
            }
            // `[v6]` or `[v6]:port`; otherwise `host` or `host:port`.
            let (name, port) = match host.strip_prefix('[') {
                Some(bracketed) => match bracketed.split_once(']') {
                    Some((name, "")) => (name, None),
                    Some((name, rest)) => match rest.strip_prefix(':') {
                        Some(port) => (name, Some(port)),
                        None => {
                            return Err(problem(format!(
                                "lists `{host}`, with `{rest}` after the address"
                            )))
                        }
                    },
                    None => {
                        return Err(problem(format!("lists `{host}`, an unclosed `[` address")))
                    }
                },
                None => match host.rsplit_once(':') {
                    Some((name, port)) => (name, Some(port)),
                    None => (host, None),
                },
            };
            let port = match port {
                Some(port) => port.parse::<u16>().map_err(|_| {
                    problem(format!(
                        "gives `{port}` as a port for the {host_kind} `{name}`"
                    ))
                })?,
                None => default_port,
            };
            if name.is_empty() {
                return Err(problem(format!("lists a {host_kind} with no host")));
            }
            parsed.push((name.to_owned(), port));
        }
        Ok(Authority {
            username,
            password,
            hosts: parsed,
        })
    }
}

/// `%XX` escapes decoded; `None` for a malformed escape or bytes that are not UTF-8.
pub(crate) fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The scheme of `url` (`redis` of `redis://…`), if it has one.
pub(crate) fn scheme_of(url: &str) -> Option<&str> {
    url.split_once("://").map(|(scheme, _)| scheme)
}

/// `url` after its scheme, `plain` or `secure` (its TLS twin, which needs the `tls` feature):
/// the rest and whether it is the TLS one; `Err` with what is wrong (`None`: neither scheme).
pub(crate) fn split_scheme<'a>(
    url: &'a str,
    plain: &str,
    secure: &str,
) -> Option<Result<(&'a str, bool), String>> {
    let rest = |scheme: &str| url.strip_prefix(scheme)?.strip_prefix("://");
    if let Some(rest) = rest(plain) {
        return Some(Ok((rest, false)));
    }
    let rest = rest(secure)?;
    Some(match cfg!(feature = "tls") {
        true => Ok((rest, true)),
        false => Err(format!(
            "asks for TLS; enable the `tls` feature of distlock to use {secure}:// URLs"
        )),
    })
}

/// `host[:port]` items of a typed constructor (`Backend::sentinel`, …), parsed: `setting` names
/// the argument in errors (credentials belong in the URL form).
pub(crate) fn host_list(
    setting: &str,
    items: &[String],
    port: u16,
) -> Result<Vec<(String, u16)>, LockError> {
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

/// The items of a typed constructor's list, as strings.
pub(crate) fn strings<I, S>(items: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    items
        .into_iter()
        .map(|item| item.as_ref().to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(authority: &str) -> Result<Vec<(String, u16)>, String> {
        let problem = |what: String| LockError::invalid_config("url", what);
        Authority::parse(authority, 26379, "sentinel", &problem)
            .map(|parsed| parsed.hosts)
            .map_err(|err| err.to_string())
    }

    #[test]
    fn hosts_with_and_without_ports_v4_v6_and_names() {
        assert_eq!(
            hosts("a,b:1,[::1],[::2]:7").unwrap(),
            vec![
                ("a".to_owned(), 26379),
                ("b".to_owned(), 1),
                ("::1".to_owned(), 26379),
                ("::2".to_owned(), 7)
            ]
        );
        assert!(hosts("[::1").unwrap_err().contains("unclosed"));
        assert!(hosts("[::1]x")
            .unwrap_err()
            .contains("with `x` after the address"));
        assert!(hosts("[]:1").unwrap_err().contains("with no host"));
    }
}
