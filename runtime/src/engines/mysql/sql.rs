//! The SQL of the MySQL store, for one lock database: the schema itself (what `distlock schema
//! mysql` prints, for the application's migrations) and the statements the store sends.
//!
//! A lock's queue is the rows of `entries` with its key, ordered by `token`, which
//! `AUTO_INCREMENT` hands out: the number is the entry's place and its holder's fencing token.
//! Lease time is the database's clock in UTC (`UTC_TIMESTAMP(6)` into `DATETIME(6)` columns),
//! whatever the session's time zone: an entry lives until its `expires_at`. A join takes the
//! key's row in `locks` first (row-locked), so the joins of one key run one after another and a
//! later one never takes a smaller token than an earlier one that committed; entries whose time
//! ran out are deleted there, before anything is decided. Keys, owners and labels are
//! `VARBINARY`: compared byte for byte, never by a collation that would make `Order:1` and
//! `order:1` one lock.

use crate::error::LockError;
use std::fmt::Write;

/// The longest lock name (prefix, braces and key) the `lock_key` column holds.
pub(crate) const MAX_LOCK_NAME: usize = 2048;

/// The longest lock database name: 40 bytes, so that an entry's presence, `dl:<database>:<token>`,
/// fits the 64 characters a named lock may have (`presence.rs`).
const MAX_IDENTIFIER: usize = 40;

/// The statements of one lock database, built once.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    pub(crate) schema: String,
    pub(crate) join: String,
    pub(crate) leave: String,
    pub(crate) renew: String,
    pub(crate) read: String,
    pub(crate) remove: String,
    pub(crate) keys: String,
}

/// Checks that `schema` is a lowercase SQL identifier, which needs no quoting anywhere.
pub(crate) fn check_schema(schema: &str) -> Result<(), LockError> {
    crate::util::identifier::check_identifier(schema, MAX_IDENTIFIER)
}

impl Statements {
    /// The statements of `schema`, which [`check_schema`] accepted.
    pub(crate) fn of(schema: &str) -> Statements {
        let s = schema;
        let ms_left = "CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) DIV 1000 \
                       AS SIGNED)";
        Statements {
            schema: s.to_owned(),
            join: format!("CALL {s}.queue_join($1, $2, $3, $4, $5, $6)"),
            leave: format!("CALL {s}.queue_leave($1, $2, $3, $4)"),
            renew: format!("CALL {s}.queue_renew($1, $2, $3)"),
            read: format!(
                "SELECT owner, token, kind, label, {ms_left} FROM {s}.entries \
                 WHERE lock_key = $1 AND expires_at > UTC_TIMESTAMP(6) ORDER BY token"
            ),
            remove: format!("CALL {s}.queue_remove($1, $2, $3, $4)"),
            keys: format!(
                "SELECT DISTINCT lock_key FROM {s}.entries \
                 WHERE LEFT(lock_key, LENGTH($1)) = $1 AND expires_at > UTC_TIMESTAMP(6)"
            ),
        }
    }
}

/// A value written into a statement in place of its `$n`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    /// Bytes, written as a hex literal (`X'…'`): no character of them is ever read as SQL,
    /// whatever `sql_mode` and the connection's character set say.
    Bytes(&'a [u8]),
    Int(i64),
}

/// `template` with each `$n` replaced by `args[n - 1]` written as a literal: one statement
/// for the text protocol, which runs in one round trip. The statements hold owners, which are
/// secrets: the store's connections log no statement.
pub(crate) fn render(template: &str, args: &[Arg<'_>]) -> String {
    crate::engines::sql::render::render(template, args, |out, arg| match arg {
        Arg::Bytes(bytes) => write_bytes(out, bytes),
        Arg::Int(n) => {
            let _ = write!(out, "{n}");
        }
    })
}

fn write_bytes(out: &mut String, bytes: &[u8]) {
    // `X''` is the empty binary string.
    out.push_str("X'");
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out.push('\'');
}

/// `bytes` as a hex literal, `X'…'`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2 + 3);
    write_bytes(&mut out, bytes);
    out
}

/// The schema of `schema`, for the `mysql` and `mariadb` clients (its procedures between
/// `DELIMITER` lines): what `distlock schema mysql` prints, `schema.sql` with the database's
/// name written in.
pub(crate) fn schema_sql(schema: &str) -> String {
    include_str!("schema.sql").replace("{schema}", schema)
}

/// The schema as one multi-statement request, as distlock sends it to create a missing
/// schema: without the comments, and without `DELIMITER`, which is the command-line client's,
/// not the server's.
pub(crate) fn schema_request(schema: &str) -> String {
    schema_sql(schema)
        .lines()
        .filter(|line| !line.starts_with("DELIMITER") && !line.starts_with("--"))
        .map(|line| line.replace(" $$", ";"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The GRANTs that give `user` (`'name'@'host'`, or a name for any host) what locks in
/// `schema` need and nothing more: rows of its two tables and its procedures. What `distlock
/// acl mysql` prints.
pub(crate) fn grants_sql(schema: &str, user: &str) -> String {
    let account = account(user);
    format!(
        "GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.locks TO {account};\n\
         GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.entries TO {account};\n\
         GRANT EXECUTE ON {schema}.* TO {account};\n"
    )
}

/// `user` as an account: `'name'@'host'` as given, or `'name'@'%'`, each part quoted.
fn account(user: &str) -> String {
    let quote = |part: &str| format!("'{}'", part.replace('\\', "\\\\").replace('\'', "''"));
    match user.rsplit_once('@') {
        Some((name, host)) => format!(
            "{}@{}",
            quote(name.trim_matches('\'')),
            quote(host.trim_matches('\''))
        ),
        None => format!("{}@'%'", quote(user)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_name_the_account_quoted() {
        let sql = grants_sql("locks", "ops'team");
        assert!(sql.contains("TO 'ops''team'@'%';"), "{sql}");
        let sql = grants_sql("locks", "'app'@'10.0.0.%'");
        assert!(sql.contains("TO 'app'@'10.0.0.%';"), "{sql}");
    }

    #[test]
    fn arguments_are_written_as_hex_literals_never_read_again() {
        let sql = render(
            "CALL f($1, $2, $3) -- $4 $x $",
            &[Arg::Bytes(b"it's \\ $2"), Arg::Int(-7), Arg::Bytes(b"")],
        );
        assert_eq!(sql, "CALL f(X'69742773205c202432', -7, X'') -- $4 $x $");
    }

    #[test]
    fn every_statement_names_the_schema_and_the_request_has_no_delimiter() {
        let sql = Statements::of("locks");
        for statement in [
            &sql.join,
            &sql.leave,
            &sql.renew,
            &sql.read,
            &sql.remove,
            &sql.keys,
        ] {
            assert!(statement.contains("locks."), "{statement}");
        }
        let schema = schema_sql("locks");
        assert!(schema.contains("CREATE TABLE IF NOT EXISTS locks.entries"));
        assert!(schema.contains("DELIMITER $$"));
        assert!(!schema.contains("{schema}"));
        let request = schema_request("locks");
        assert!(!request.contains("DELIMITER"), "{request}");
        assert!(!request.contains("$$"), "{request}");
        assert!(request.contains("END;"), "{request}");
    }
}
