//! SQL identifiers that need no quoting anywhere: the lock schema of a database engine.

use crate::error::LockError;

/// Checks that `name` is a lowercase SQL identifier of at most `max` bytes: letters, digits and
/// `_`, not starting with a digit. Such a name is written into statements as it is (and, on
/// PostgreSQL, is a channel name too).
pub(crate) fn check_identifier(name: &str, max: usize) -> Result<(), LockError> {
    let first_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    match first_ok && rest_ok && name.len() <= max {
        true => Ok(()),
        false => Err(LockError::invalid_config(
            "schema",
            format!(
                "is `{}`; it must be a lowercase SQL identifier: letters, digits and `_`, not \
                 starting with a digit, at most {max} bytes",
                name.escape_debug()
            ),
        )),
    }
}
