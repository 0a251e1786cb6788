//! The SQL of the PostgreSQL store, for one schema: the schema itself (what `distlock schema
//! postgres` prints, for the application's migrations) and the statements the store sends.
//!
//! A lock's queue is the rows of `entries` with its key, ordered by `token`, which a sequence
//! hands out: the number is the entry's place and its holder's fencing token. Lease time is the
//! database's clock (`clock_timestamp()`): an entry lives until its `expires_at`. A join takes
//! the key's row in `locks` first (row-locked), so the joins of one key run one after another
//! and a later one never takes a smaller token than an earlier one that committed; entries
//! whose time ran out are deleted there, before anything is decided. Every change is told on a
//! channel named after the schema (`NOTIFY`): `j`, `r`, `d` (joined, renewed, deleted), the
//! key, the owner, and the changing transaction's id.

use crate::error::LockError;
use std::fmt::Write;

/// The longest identifier PostgreSQL keeps (`NAMEDATALEN - 1`).
const MAX_IDENTIFIER: usize = 63;

/// The statements of one schema, built once.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    pub(crate) schema: String,
    pub(crate) join: String,
    pub(crate) leave: String,
    pub(crate) renew: String,
    pub(crate) read: String,
    pub(crate) remove: String,
    pub(crate) keys: String,
    pub(crate) fence: String,
}

/// Checks that `schema` is a lowercase SQL identifier, which needs no quoting anywhere (a
/// channel name included).
pub(crate) fn check_schema(schema: &str) -> Result<(), LockError> {
    crate::util::identifier::check_identifier(schema, MAX_IDENTIFIER)
}

impl Statements {
    /// The statements of `schema`, which [`check_schema`] accepted.
    pub(crate) fn of(schema: &str) -> Statements {
        let s = schema;
        Statements {
            schema: s.to_owned(),
            join: format!("SELECT * FROM {s}.join($1, $2, $3, $4, $5, $6)"),
            leave: format!("SELECT {s}.leave($1, $2, $3)"),
            renew: format!("SELECT * FROM {s}.renew($1, $2, $3)"),
            read: format!(
                "SELECT owner, token, kind, label, \
                 (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint \
                 FROM {s}.entries WHERE key = $1 AND expires_at > clock_timestamp() \
                 ORDER BY token"
            ),
            remove: format!("SELECT {s}.remove($1, $2, $3, $4)"),
            keys: format!(
                "SELECT DISTINCT key FROM {s}.entries \
                 WHERE starts_with(key, $1) AND expires_at > clock_timestamp()"
            ),
            fence: format!(
                "SELECT e.key FROM {s}.entries e \
                 JOIN unnest($1::text[], $2::text[], $3::bigint[]) AS held(key, owner, token) \
                 ON e.key = held.key AND e.owner = held.owner AND e.token = held.token \
                 WHERE e.expires_at > clock_timestamp() \
                 FOR KEY SHARE OF e"
            ),
        }
    }
}

/// A value written into a statement in place of its `$n`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    Text(&'a str),
    Int(i64),
    Texts(&'a [String]),
    Ints(&'a [i64]),
}

/// `template` with each `$n` replaced by `args[n - 1]` written as a literal: one statement
/// for the simple query protocol, which runs in one round trip and one transaction, so that
/// a transaction-mode pooler runs it whole on one server connection (the extended protocol's
/// unnamed statement is prepared in one transaction and run in the next, which such a pooler
/// may send elsewhere).
///
/// Text is written as an escape string (`E'…'`, its `\` and `'` doubled), which reads the same
/// whatever `standard_conforming_strings` says; the replaced text is never scanned again. Keys,
/// prefixes and labels hold no control character (checked where they are made), so no NUL
/// reaches a statement. The statements hold owners, which are secrets: the store's
/// connections log no statement.
pub(crate) fn render(template: &str, args: &[Arg<'_>]) -> String {
    crate::engines::sql::render::render(template, args, |out, arg| write_arg(out, *arg))
}

fn write_arg(out: &mut String, arg: Arg<'_>) {
    match arg {
        Arg::Text(text) => write_text(out, text),
        Arg::Int(n) => {
            let _ = write!(out, "{n}::bigint");
        }
        Arg::Texts(texts) => {
            out.push_str("ARRAY[");
            for (i, text) in texts.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_text(out, text);
            }
            out.push_str("]::text[]");
        }
        Arg::Ints(ints) => {
            out.push_str("ARRAY[");
            for (i, n) in ints.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{n}");
            }
            out.push_str("]::bigint[]");
        }
    }
}

fn write_text(out: &mut String, text: &str) {
    debug_assert!(!text.contains('\0'), "a NUL in {text:?}");
    out.push_str("E'");
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("''"),
            c => out.push(c),
        }
    }
    out.push_str("'::text");
}

/// The schema of `schema`: everything the store needs, created if it is not there (each
/// statement idempotent). What `distlock schema postgres` prints: `schema.sql`, with the
/// schema's name written in.
pub(crate) fn schema_sql(schema: &str) -> String {
    include_str!("schema.sql").replace("{schema}", schema)
}

/// The GRANTs that give `user` what locks in `schema` need and nothing more: the schema, its
/// two tables and sequence, and its functions. What `distlock acl postgres` prints.
pub(crate) fn grants_sql(schema: &str, user: &str) -> String {
    let user = format!("\"{}\"", user.replace('"', "\"\""));
    format!(
        "GRANT USAGE ON SCHEMA {schema} TO {user};\n\
         GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.locks, {schema}.entries TO {user};\n\
         GRANT USAGE ON SEQUENCE {schema}.tokens TO {user};\n\
         GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {user};\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_name_the_user_as_one_quoted_identifier() {
        let sql = grants_sql("locks", "ops \"team\"; DROP");
        assert!(sql.contains("TO \"ops \"\"team\"\"; DROP\";"), "{sql}");
    }

    #[test]
    fn a_schema_is_a_plain_identifier() {
        assert!(check_schema("distlock").is_ok());
        assert!(check_schema("locks_2").is_ok());
        for bad in ["", "Locks", "2locks", "a-b", "a.b", "a\"b", &"x".repeat(64)] {
            let err = check_schema(bad).unwrap_err().to_string();
            assert!(err.contains("lowercase SQL identifier"), "{bad}: {err}");
        }
    }

    #[test]
    fn arguments_are_written_as_literals_never_read_again() {
        let sql = render(
            "SELECT f($1, $2, $3, $4) -- $5 $x $",
            &[
                Arg::Text("it's a \\ $2"),
                Arg::Int(-7),
                Arg::Texts(&["a".into(), "b'".into()]),
                Arg::Ints(&[]),
            ],
        );
        assert_eq!(
            sql,
            "SELECT f(E'it''s a \\\\ $2'::text, -7::bigint, \
             ARRAY[E'a'::text,E'b'''::text]::text[], ARRAY[]::bigint[]) -- $5 $x $"
        );
    }

    #[test]
    fn every_statement_names_the_schema() {
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
        assert!(schema.contains("pg_notify('locks',"));
        assert!(!schema.contains("distlock."));
    }
}
