//! Redis's glob patterns (`*`, `?`, `[abc]`, `[^a-z]`, `\x`), for the in-process backend's
//! [`Backend::list`](crate::Backend::list), which must match what `SCAN MATCH` matches.

/// Whether `text` matches the glob `pattern`.
pub(crate) fn glob_match(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    matches(&pattern, &text)
}

fn matches(pattern: &[char], text: &[char]) -> bool {
    let Some((&first, rest)) = pattern.split_first() else {
        return text.is_empty();
    };
    match first {
        '*' => (0..=text.len()).any(|skip| matches(rest, &text[skip..])),
        '?' => !text.is_empty() && matches(rest, &text[1..]),
        '[' => {
            let Some((&c, remaining)) = text.split_first() else {
                return false;
            };
            match class(rest, c) {
                Some((true, after)) => matches(after, remaining),
                Some((false, _)) => false,
                // An unclosed `[` is a literal.
                None => c == '[' && matches(rest, remaining),
            }
        }
        '\\' if !rest.is_empty() => {
            text.first() == Some(&rest[0]) && matches(&rest[1..], &text[1..])
        }
        literal => text.first() == Some(&literal) && matches(rest, &text[1..]),
    }
}

/// Whether `c` is in the class that `pattern` (just after its `[`) opens, and the pattern after
/// the class's `]`; `None` when the class is not closed.
fn class(pattern: &[char], c: char) -> Option<(bool, &[char])> {
    let (negated, mut rest) = match pattern.split_first() {
        Some(('^', rest)) => (true, rest),
        _ => (false, pattern),
    };
    let mut found = false;
    loop {
        match rest {
            [] => return None,
            [']', after @ ..] => return Some((found != negated, after)),
            ['\\', escaped, after @ ..] => {
                found |= *escaped == c;
                rest = after;
            }
            [low, '-', high, after @ ..] if *high != ']' => {
                found |= (*low.min(high)..=*low.max(high)).contains(&c);
                rest = after;
            }
            [single, after @ ..] => {
                found |= *single == c;
                rest = after;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn globs_match_like_redis() {
        assert!(glob_match("order:*", "order:17"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("order:?", "order:17"));
        assert!(glob_match("order:??", "order:17"));
        assert!(glob_match("order:[0-9]*", "order:17"));
        assert!(!glob_match("order:[^0-9]*", "order:17"));
        assert!(glob_match("a\\*b", "a*b"));
        assert!(!glob_match("a\\*b", "axb"));
        assert!(glob_match("[ab]", "b"));
        assert!(glob_match("x[", "x["));
    }
}
