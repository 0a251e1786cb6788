//! Statements with their values written in: each `$n` of a template replaced by the `n`th
//! value, as a literal the database's own writer makes. The replaced text is never scanned
//! again, so a value that contains `$2` stays a value.

/// `template` with each `$n` replaced by what `write` writes for `args[n - 1]`; a `$` not
/// followed by the number of an argument stays as it is.
pub(crate) fn render<A>(template: &str, args: &[A], write: impl Fn(&mut String, &A)) -> String {
    let mut out = String::with_capacity(template.len() + 128);
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len() - at - 1);
        let number: Option<usize> = rest[at + 1..at + 1 + digits].parse().ok();
        match number
            .and_then(|n| n.checked_sub(1))
            .and_then(|n| args.get(n))
        {
            Some(arg) => write(&mut out, arg),
            None => out.push_str(&rest[at..at + 1 + digits]),
        }
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    out
}
