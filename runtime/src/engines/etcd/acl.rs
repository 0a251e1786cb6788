//! The rights an etcd lock user needs: read and write on the keys under its prefix, nothing
//! else (leases need no permission).

/// The start of every key distlock writes on etcd under `prefix`: a lock user's role needs
/// `readwrite` on the keys that start with it, and nothing else.
///
/// ```
/// assert_eq!(distlock::etcd::key_prefix("billing"), "billing:{");
/// ```
pub fn key_prefix(prefix: &str) -> String {
    format!("{prefix}:{{")
}

/// The `etcdctl` commands that give `user` exactly the rights distlock needs under `prefix`:
/// a role `<user>-locks` with `readwrite` on [`key_prefix`], granted to the user. What
/// `distlock acl etcd` prints.
///
/// ```
/// let commands = distlock::etcd::acl_commands("billing", "locker");
/// assert!(commands.contains("etcdctl role grant-permission locker-locks readwrite --prefix=true 'billing:{'"));
/// ```
pub fn acl_commands(prefix: &str, user: &str) -> String {
    let role = shell_quote(&format!("{user}-locks"));
    let keys = shell_quote(&key_prefix(prefix));
    let user = shell_quote(user);
    format!(
        "etcdctl role add {role}\n\
         etcdctl role grant-permission {role} readwrite --prefix=true {keys}\n\
         etcdctl user grant-role {user} {role}\n"
    )
}

/// `text` as one shell word: as it is when it is plain, else in single quotes.
fn shell_quote(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/@".contains(c));
    match plain {
        true => text.to_owned(),
        false => format!("'{}'", text.replace('\'', r"'\''")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commands_quote_what_the_shell_would_split() {
        let commands = acl_commands("it's", "ops team");
        assert!(
            commands.contains("--prefix=true 'it'\\''s:{'"),
            "{commands}"
        );
        assert!(commands.contains("etcdctl user grant-role 'ops team' 'ops team-locks'"));
    }
}
