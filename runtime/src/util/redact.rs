//! Credentials kept out of messages: URLs are shown with their password replaced.

/// The URL with any password replaced by `***` (the user info's, and a `sentinel_password` in
/// the query), for error messages and logs.
pub(crate) fn redact_url(url: &str) -> String {
    match url.split_once('?') {
        Some((base, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _)) if name == "sentinel_password" => format!("{name}=***"),
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{}?{}", redact_authority(base), query.join("&"))
        }
        None => redact_authority(url),
    }
}

fn redact_authority(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{host}{path}")
            } else {
                format!("{scheme}://***@{host}{path}")
            }
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact_url("redis://:hunter2@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redact_url("redis://u:p@h"), "redis://u:***@h");
        assert_eq!(redact_url("redis://token@h"), "redis://***@h");
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
        assert_eq!(
            redact_url("redis-sentinel://:pw@a:1,b:2/m?db=1&sentinel_password=pw2"),
            "redis-sentinel://:***@a:1,b:2/m?db=1&sentinel_password=***"
        );
    }
}
