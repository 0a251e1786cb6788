//! Lock keys: escaping of rendered values, validation, and the Redis key names derived from a key.

use crate::LockError;
use std::fmt::{self, Write as _};

/// Builds a lock key from template text and argument values: what `#[distributed_lock]`'s
/// generated code renders its `key` with (hidden: macro support, not an API).
///
/// Template text is copied verbatim; values are escaped so that they cannot change the key's
/// structure: every character except ASCII letters and digits, `_`, `.`, `-`, `@` and printable
/// non-ASCII characters is written as `%XX` (per UTF-8 byte). `%` itself is escaped, so the encoding
/// is injective: with a separator such as `:` between values, two different argument tuples never
/// render the same key, and no value can introduce a Redis Cluster hash tag (`{`, `}`) or a control
/// character.
///
/// ```
/// use distlock::__private::KeyBuilder;
///
/// let a = KeyBuilder::new().literal("pair:").value(&"a:b").literal(":").value(&"c").finish();
/// let b = KeyBuilder::new().literal("pair:").value(&"a").literal(":").value(&"b:c").finish();
/// assert_eq!(a, "pair:a%3Ab:c");
/// assert_eq!(b, "pair:a:b%3Ac");
/// assert_ne!(a, b);
/// ```
#[derive(Debug, Default, Clone)]
pub struct KeyBuilder {
    key: String,
}

impl KeyBuilder {
    /// An empty key.
    pub fn new() -> Self {
        KeyBuilder::default()
    }

    /// Appends template text verbatim.
    pub fn literal(&mut self, text: &str) -> &mut Self {
        self.key.push_str(text);
        self
    }

    /// Appends a value rendered with `Display`, escaped.
    pub fn value(&mut self, value: &dyn fmt::Display) -> &mut Self {
        let mut escaper = Escaper(&mut self.key);
        // Writing into a String cannot fail; a Display impl that returns Err is a bug in that impl,
        // and what it wrote so far is still a well-formed, escaped prefix.
        let _ = write!(escaper, "{value}");
        self
    }

    /// The finished key (the builder is left empty).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.key)
    }
}

/// Escapes everything written through it into the wrapped string.
struct Escaper<'a>(&'a mut String);

impl fmt::Write for Escaper<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            if is_kept(c) {
                self.0.push(c);
            } else {
                let mut utf8 = [0u8; 4];
                for byte in c.encode_utf8(&mut utf8).bytes() {
                    write!(self.0, "%{byte:02X}")?;
                }
            }
        }
        Ok(())
    }
}

/// Characters a rendered value keeps as they are.
pub(crate) fn is_kept(c: char) -> bool {
    c.is_ascii_alphanumeric()
        || matches!(c, '_' | '.' | '-' | '@')
        || (!c.is_ascii() && !c.is_control())
}

/// Checks a complete user key before it is used: non-empty, at most `max_len` bytes, and free of
/// the characters that would change its structure on the server.
pub(crate) fn validate(key: &str, max_len: usize) -> Result<(), LockError> {
    let invalid = |reason: String| Err(LockError::InvalidKey { reason });
    if key.is_empty() {
        return invalid("the key is empty; give every lock a name such as `order:42`".into());
    }
    if key.len() > max_len {
        return invalid(format!(
            "the key is {} bytes long, over the backend's limit of {max_len}; shorten the template \
             or raise the limit with BackendBuilder::max_key_len",
            key.len()
        ));
    }
    if let Some(c) = key
        .chars()
        .find(|c| matches!(c, '{' | '}') || c.is_control())
    {
        return invalid(format!(
            "the key `{}` contains {c:?}, which would change its hash slot or break log lines; \
             leave such values out of the key, or take them through an attribute \
             placeholder, which escapes them",
            key.escape_debug()
        ));
    }
    Ok(())
}

/// The server-side names of one lock key. All of them carry the same hash tag, so they live in
/// one Cluster slot and a script may touch them together.
#[derive(Debug, Clone)]
pub(crate) struct KeyNames {
    pub(crate) lock: String,
    pub(crate) channel: String,
}

impl KeyNames {
    pub(crate) fn new(prefix: &str, key: &str) -> KeyNames {
        let lock = lock_name(prefix, key);
        KeyNames {
            channel: channel_of(&lock),
            lock,
        }
    }
}

/// The server-side name of `key`'s lock, `<prefix>:{<key>}` (the hot paths need only this one).
pub(crate) fn lock_name(prefix: &str, key: &str) -> String {
    let mut lock = String::with_capacity(prefix.len() + key.len() + 3);
    lock.push_str(prefix);
    lock.push_str(":{");
    lock.push_str(key);
    lock.push('}');
    lock
}

/// The key a lock name was made from (`<prefix>:{<key>}` → `<key>`); `None` for a name that is
/// not one (a pattern can match more than lock names, e.g. with `}` inside it).
pub(crate) fn key_of<'a>(prefix: &str, lock: &'a str) -> Option<&'a str> {
    lock.strip_prefix(prefix)?
        .strip_prefix(":{")?
        .strip_suffix('}')
}

/// The sorted set of a shared lock's holders (readers, permits), beside the lock named `lock`
/// (the scripts derive it the same way).
pub(crate) fn holders_of(lock: &str) -> String {
    format!("{lock}:holders")
}

/// The release notification channel of the lock named `lock` (the release script derives it the
/// same way).
pub(crate) fn channel_of(lock: &str) -> String {
    format!("{lock}:released")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_back_from_lock_names() {
        assert_eq!(key_of("app", "app:{order:7}"), Some("order:7"));
        assert_eq!(key_of("app", "app:{order:7}:released"), None);
        assert_eq!(key_of("app", "other:{order:7}"), None);
    }

    fn render(values: &[&str]) -> String {
        let mut key = KeyBuilder::new();
        key.literal("t");
        for value in values {
            key.literal(":").value(value);
        }
        key.finish()
    }

    #[test]
    fn separators_inside_values_are_escaped() {
        assert_ne!(render(&["a:b", "c"]), render(&["a", "b:c"]));
        assert_eq!(render(&["{x}"]), "t:%7Bx%7D");
        assert_eq!(render(&["a\nb"]), "t:a%0Ab");
        assert_eq!(render(&["100%"]), "t:100%25");
        assert_eq!(render(&["żółw"]), "t:żółw");
        assert_eq!(render(&["", ""]), "t::");
    }

    #[test]
    fn unicode_controls_are_escaped() {
        assert_eq!(render(&["\u{85}"]), "t:%C2%85");
    }

    #[test]
    fn validation_names_the_problem() {
        assert!(validate("ok:1", 10).is_ok());
        let long = validate("0123456789a", 10).unwrap_err().to_string();
        assert!(
            long.contains("11 bytes long, over the backend's limit of 10"),
            "{long}"
        );
        let brace = validate("a{b}", 10).unwrap_err().to_string();
        assert!(brace.contains("'{'"), "{brace}");
        assert!(validate("", 10).unwrap_err().to_string().contains("empty"));
    }

    #[test]
    fn names_share_one_hash_tag() {
        let names = KeyNames::new("app", "order:7");
        assert_eq!(names.lock, "app:{order:7}");
        assert_eq!(names.channel, "app:{order:7}:released");
    }
}
