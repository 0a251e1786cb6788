//! Key template → segments; placeholders checked against the function's signature.
//!
//! A template is text with placeholders: `"order:<order.id>"`, `"user:<self.tenant>:<id>"`. Text
//! goes into the key verbatim; a placeholder names a parameter (or a name bound inside a parameter
//! pattern, or `self`) followed by a field path, and renders with `Display`, escaped by the runtime
//! so that a value cannot change the key's structure.
//!
//! Two phases, so the syntax can be unit-tested without a signature: [`parse`] works on the text
//! alone and reports problems as byte ranges of it; [`Template::check`] resolves the placeholders
//! against [`Params`] and turns both kinds of problem into errors spanned at the literal.

use std::ops::Range;

use proc_macro2::Span;
use syn::{Error, FnArg, Ident, LitStr, Member, Pat, Signature};

use crate::errors::Errors;

/// One piece of a template's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    Text(String),
    /// `<order.id>` is `path: ["order", "id"]`; `range` covers the whole `<…>` in the template text.
    Placeholder {
        path: Vec<String>,
        range: Range<usize>,
    },
}

/// A syntax problem in the template text, located by byte range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub(crate) range: Range<usize>,
    pub(crate) message: String,
}

/// Splits template text into pieces. Every problem is reported, not only the first.
pub(crate) fn parse(text: &str) -> Result<Vec<Piece>, Vec<Problem>> {
    if text.is_empty() {
        return Err(vec![Problem {
            range: 0..0,
            message:
                "empty key template; expected text and placeholders, such as `order:<order.id>`"
                    .into(),
        }]);
    }
    let mut scan = Scan::default();
    let mut at = 0;
    // All delimiters are ASCII, so every index the scan stops at is a char boundary.
    while at < text.len() {
        if text.as_bytes()[at] == b'<' {
            if let Some(end) = scan.placeholder(text, at) {
                at = end;
                continue;
            }
        } else {
            scan.check_character(text, at);
        }
        let len = text[at..].chars().next().map_or(1, char::len_utf8);
        scan.literal.push_str(&text[at..at + len]);
        at += len;
    }
    let Scan {
        mut pieces,
        literal,
        mut problems,
        ..
    } = scan;
    if !literal.is_empty() {
        pieces.push(Piece::Text(literal));
    }
    check_separators(&pieces, &mut problems);
    if problems.is_empty() {
        Ok(pieces)
    } else {
        Err(problems)
    }
}

/// What [`parse`] has found so far.
#[derive(Default)]
struct Scan {
    pieces: Vec<Piece>,
    /// Text since the last placeholder.
    literal: String,
    problems: Vec<Problem>,
    /// A brace, and a control character, are reported once per template.
    reported_brace: bool,
    reported_control: bool,
}

impl Scan {
    /// The placeholder that starts with the `<` at `at`: where the scan goes on after it, or
    /// `None` when that `<` is unclosed (reported; the scan goes on at the next character).
    fn placeholder(&mut self, text: &str, at: usize) -> Option<usize> {
        let rest = &text[at + 1..];
        match rest.find(['<', '>']) {
            Some(end) if rest.as_bytes()[end] == b'>' => {
                let range = at..at + 1 + end + 1;
                match placeholder_path(&rest[..end]) {
                    Ok(path) => {
                        if !self.literal.is_empty() {
                            self.pieces
                                .push(Piece::Text(std::mem::take(&mut self.literal)));
                        }
                        self.pieces.push(Piece::Placeholder {
                            path,
                            range: range.clone(),
                        });
                    }
                    Err(message) => self.problems.push(Problem {
                        range: range.clone(),
                        message,
                    }),
                }
                Some(range.end)
            }
            // A second `<` before any `>`: this one is unclosed; rescan from the next one.
            _ => {
                self.problems.push(Problem {
                    range: at..at + 1,
                    message: "unclosed `<` in key template; a placeholder ends with `>`, such as `<order.id>`"
                        .into(),
                });
                None
            }
        }
    }

    /// Reports the character at `at` if a key cannot hold it: `>` outside a placeholder,
    /// braces, control characters.
    fn check_character(&mut self, text: &str, at: usize) {
        match text.as_bytes()[at] {
            b'>' => self.problems.push(Problem {
                range: at..at + 1,
                message: "unmatched `>` in key template; `>` only closes a placeholder, such as `<order.id>`".into(),
            }),
            b'{' | b'}' if !self.reported_brace => {
                self.reported_brace = true;
                self.problems.push(Problem {
                    range: at..at + 1,
                    message: "key templates cannot contain `{` or `}`; the runtime adds the Redis Cluster hash \
                              tag itself, so write the key without braces"
                        .into(),
                });
            }
            _ if !self.reported_control && text[at..].starts_with(char::is_control) => {
                self.reported_control = true;
                let control = text[at..].chars().next().unwrap_or_default();
                self.problems.push(Problem {
                    range: at..at + control.len_utf8(),
                    message: format!(
                        "key templates cannot contain control characters such as `{}`; the runtime rejects \
                         keys that contain them",
                        control.escape_default()
                    ),
                });
            }
            _ => {}
        }
    }
}

/// `order.id` → `["order", "id"]`: an identifier (or `self`), then identifiers or tuple indices.
fn placeholder_path(inner: &str) -> Result<Vec<String>, String> {
    if inner.is_empty() {
        return Err("empty placeholder `<>`; name a parameter, such as `<id>`, or a field path, such as `<order.id>`".into());
    }
    let invalid = || {
        format!(
            "`<{inner}>` is not a valid placeholder; expected a parameter name, such as `<id>`, or a field path, \
             such as `<order.id>`"
        )
    };
    let segments: Vec<&str> = inner.split('.').collect();
    let root_ok = segments[0] == "self" || is_identifier(segments[0]);
    let fields_ok = segments[1..]
        .iter()
        .all(|field| is_identifier(field) || is_tuple_index(field));
    if !root_ok || !fields_ok {
        return Err(invalid());
    }
    if segments == ["self"] {
        return Err(
            "`<self>` names the whole receiver; name one of its fields, such as `<self.id>`".into(),
        );
    }
    Ok(segments.into_iter().map(str::to_owned).collect())
}

/// A Rust identifier as written in source, raw identifiers (`r#type`) included; not a keyword.
fn is_identifier(text: &str) -> bool {
    // The tokenizer would skip surrounding whitespace and comments; a key template must not.
    !text.is_empty()
        && !text.contains(|c: char| c.is_whitespace() || c == '/')
        && syn::parse_str::<Ident>(text).is_ok_and(|ident| ident == text)
}

fn is_tuple_index(text: &str) -> bool {
    !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'))
}

/// Characters a rendered value can contain: those the runtime copies unescaped, and `%`, which
/// starts its `%XX` escapes. A separator made only of these could also come out of a value, so
/// `<a>-<b>` renders `x-y-z` for both `("x-y", "z")` and `("x", "y-z")`, and `<a>%<b>` renders
/// `%3A%3A` for both `("", "3A:")` and (`":"`, `"3A"`).
fn renderable(c: char) -> bool {
    c.is_ascii_alphanumeric()
        || matches!(c, '_' | '.' | '-' | '@' | '%')
        || (!c.is_ascii() && !c.is_control())
}

fn check_separators(pieces: &[Piece], problems: &mut Vec<Problem>) {
    let mut previous: Option<(&[String], &Range<usize>)> = None;
    let mut between = String::new();
    for piece in pieces {
        match piece {
            Piece::Text(text) => between.push_str(text),
            Piece::Placeholder { path, range } => {
                if let Some((left, left_range)) = previous {
                    if between.chars().all(renderable) {
                        problems.push(Problem {
                            range: left_range.start..range.end,
                            message: format!(
                                "placeholders `<{}>` and `<{}>` need a separator such as `:` between them; without \
                                 one different arguments can render the same key",
                                left.join("."),
                                path.join("."),
                            ),
                        });
                    }
                }
                previous = Some((path, range));
                between.clear();
            }
        }
    }
}

/// The names a key template may refer to: the receiver and every name bound by a parameter pattern.
pub(crate) struct Params {
    function: String,
    /// The span of the `self` token, when the function has a receiver.
    receiver: Option<Span>,
    names: Vec<Ident>,
}

impl Params {
    pub(crate) fn of(sig: &Signature) -> Params {
        let mut names = Vec::new();
        let mut receiver = None;
        for input in &sig.inputs {
            match input {
                FnArg::Receiver(found) => receiver = Some(found.self_token.span),
                FnArg::Typed(typed) => bound_names(&typed.pat, &mut names),
            }
        }
        Params {
            function: sig.ident.to_string(),
            receiver,
            names,
        }
    }

    fn find(&self, name: &str) -> Option<&Ident> {
        self.names.iter().find(|ident| *ident == name)
    }

    /// "`order`, `amount`", listing what a placeholder may start with.
    fn available(&self) -> String {
        let receiver = self.receiver.map(|_| "`self.<field>`".to_owned());
        let names = self.names.iter().map(|name| format!("`{name}`"));
        let all: Vec<String> = receiver.into_iter().chain(names).collect();
        if all.is_empty() {
            format!(
                "`{}` has no parameters, so its key can only be fixed text",
                self.function
            )
        } else {
            format!("available parameters: {}", all.join(", "))
        }
    }
}

fn bound_names(pat: &Pat, names: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(binding) => {
            names.push(binding.ident.clone());
            if let Some((_, sub)) = &binding.subpat {
                bound_names(sub, names);
            }
        }
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|elem| bound_names(elem, names)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|elem| bound_names(elem, names)),
        Pat::Struct(strukt) => strukt
            .fields
            .iter()
            .for_each(|field| bound_names(&field.pat, names)),
        Pat::Slice(slice) => slice.elems.iter().for_each(|elem| bound_names(elem, names)),
        Pat::Reference(reference) => bound_names(&reference.pat, names),
        Pat::Paren(paren) => bound_names(&paren.pat, names),
        Pat::Type(typed) => bound_names(&typed.pat, names),
        // Parameters are irrefutable, so every case of an or-pattern binds the same names.
        Pat::Or(or) => or
            .cases
            .iter()
            .take(1)
            .for_each(|case| bound_names(case, names)),
        _ => {}
    }
}

/// A template whose placeholders all name something the function has.
pub(crate) struct Template {
    /// The template as written: the `lock` label of the runtime's metrics.
    pub(crate) text: String,
    pub(crate) segments: Vec<Segment>,
}

pub(crate) enum Segment {
    Text(String),
    /// `root.fields…`, every token spanned at the placeholder so that rustc's own errors about it
    /// (no such field, not `Display`) point into the template.
    Value {
        root: Ident,
        fields: Vec<Member>,
        span: Span,
    },
}

impl Template {
    /// Parses `literal` and resolves its placeholders against `params`; reports every problem.
    pub(crate) fn check(
        literal: &LitStr,
        params: &Params,
        errors: &mut Errors,
    ) -> Option<Template> {
        let text = literal.value();
        let pieces = match parse(&text) {
            Ok(pieces) => pieces,
            Err(problems) => {
                for problem in problems {
                    errors.push(Error::new(
                        sub_span(literal, &text, problem.range),
                        problem.message,
                    ));
                }
                return None;
            }
        };
        let mut segments = Vec::with_capacity(pieces.len());
        let mut resolved = true;
        for piece in pieces {
            match piece {
                Piece::Text(text) => segments.push(Segment::Text(text)),
                Piece::Placeholder { path, range } => {
                    let span = sub_span(literal, &text, range);
                    match resolve(&path, span, params) {
                        Ok(segment) => segments.push(segment),
                        Err(message) => {
                            errors.push(Error::new(span, message));
                            resolved = false;
                        }
                    }
                }
            }
        }
        resolved.then_some(Template { text, segments })
    }
}

fn resolve(path: &[String], span: Span, params: &Params) -> Result<Segment, String> {
    let placeholder = path.join(".");
    // Every name is placed at the literal (for error messages) but resolved where the parameter
    // was declared: a `macro_rules!` macro may declare the parameters while the template comes
    // from its caller, whose hygiene could not see them.
    let root = if path[0] == "self" {
        let Some(receiver) = params.receiver else {
            return Err(format!(
                "`<{placeholder}>` needs a `self` receiver, which `{}` does not have; {}",
                params.function,
                params.available(),
            ));
        };
        Ident::new("self", span.resolved_at(receiver))
    } else {
        let Some(found) = params.find(&path[0]) else {
            return Err(format!(
                "unknown parameter `{}` in `<{placeholder}>`; {}",
                path[0],
                params.available()
            ));
        };
        let mut root = found.clone();
        root.set_span(span.resolved_at(found.span()));
        root
    };
    let fields = path[1..]
        .iter()
        .map(|field| match field.parse::<u32>() {
            Ok(index) => Member::Unnamed(syn::Index { index, span }),
            Err(_) => Member::Named(syn::parse_str::<Ident>(field).map_or_else(
                |_| Ident::new(field, span),
                |mut ident| {
                    ident.set_span(span);
                    ident
                },
            )),
        })
        .collect();
    Ok(Segment::Value { root, fields, span })
}

/// The span of `range` (bytes of the literal's value) inside the literal, where the compiler can
/// give one (it cannot on stable Rust today), else the whole literal.
fn sub_span(literal: &LitStr, value: &str, range: Range<usize>) -> Span {
    let source = literal.token().to_string();
    // Only a literal whose source is its value in quotes maps value bytes to source bytes 1:1.
    let offset =
        if source.len() == value.len() + 2 && !source.contains('\\') && source.starts_with('"') {
            Some(1)
        } else {
            source.strip_prefix('r').and_then(|raw| {
                let hashes = raw.len() - raw.trim_start_matches('#').len();
                (source.len() == value.len() + 3 + 2 * hashes).then_some(2 + hashes)
            })
        };
    offset
        .and_then(|offset| {
            literal
                .token()
                .subspan(range.start + offset..range.end + offset)
        })
        .unwrap_or_else(|| literal.span())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(text: &str) -> Piece {
        Piece::Text(text.into())
    }

    fn placeholder(path: &[&str], range: Range<usize>) -> Piece {
        Piece::Placeholder {
            path: path.iter().map(|s| s.to_string()).collect(),
            range,
        }
    }

    fn messages(template: &str) -> Vec<String> {
        parse(template)
            .unwrap_err()
            .into_iter()
            .map(|problem| problem.message)
            .collect()
    }

    #[test]
    fn splits_text_and_placeholders() {
        assert_eq!(
            parse("order:<order.id>").unwrap(),
            vec![text("order:"), placeholder(&["order", "id"], 6..16)]
        );
        assert_eq!(
            parse("<self.tenant>:<id>:x").unwrap(),
            vec![
                placeholder(&["self", "tenant"], 0..13),
                text(":"),
                placeholder(&["id"], 14..18),
                text(":x")
            ]
        );
        assert_eq!(parse("static").unwrap(), vec![text("static")]);
        assert_eq!(
            parse("p:<pair.0>").unwrap(),
            vec![text("p:"), placeholder(&["pair", "0"], 2..10)]
        );
        assert_eq!(
            parse("t:<r#type>").unwrap(),
            vec![text("t:"), placeholder(&["r#type"], 2..10)]
        );
        assert_eq!(
            parse("ü:<id>").unwrap(),
            vec![text("ü:"), placeholder(&["id"], 3..7)]
        );
    }

    #[test]
    fn rejects_empty_template_and_placeholder() {
        assert_eq!(
            messages(""),
            ["empty key template; expected text and placeholders, such as `order:<order.id>`"]
        );
        assert_eq!(
            messages("a:<>"),
            ["empty placeholder `<>`; name a parameter, such as `<id>`, or a field path, such as `<order.id>`"]
        );
    }

    #[test]
    fn rejects_unbalanced_delimiters() {
        let unclosed =
            "unclosed `<` in key template; a placeholder ends with `>`, such as `<order.id>`";
        let unmatched =
            "unmatched `>` in key template; `>` only closes a placeholder, such as `<order.id>`";
        assert_eq!(messages("a:<id"), [unclosed]);
        assert_eq!(parse("a:<id").unwrap_err()[0].range, 2..3);
        assert_eq!(messages("a:id>"), [unmatched]);
        // The first `<` is unclosed; the second one still opens a valid placeholder.
        assert_eq!(messages("a:<b:<c>"), [unclosed]);
        assert_eq!(messages("<a>>"), [unmatched]);
    }

    #[test]
    fn rejects_invalid_paths() {
        for bad in [
            "<1a>", "<a..b>", "<a.>", "<.a>", "<a b>", "< a>", "<a-b>", "<a.b()>", "<fn>", "<_>",
            "<a.01>", "<a/**/>",
        ] {
            let inner = &bad[1..bad.len() - 1];
            assert_eq!(
                messages(bad),
                [format!(
                    "`<{inner}>` is not a valid placeholder; expected a parameter name, such as `<id>`, or a field \
                     path, such as `<order.id>`"
                )],
                "{bad}"
            );
        }
        assert_eq!(
            messages("<self>"),
            ["`<self>` names the whole receiver; name one of its fields, such as `<self.id>`"]
        );
    }

    #[test]
    fn rejects_braces_once() {
        assert_eq!(
            messages("{a}:<id>:{b}"),
            ["key templates cannot contain `{` or `}`; the runtime adds the Redis Cluster hash tag itself, so write \
              the key without braces"]
        );
    }

    #[test]
    fn adjacent_placeholders_need_an_escaped_separator() {
        let needs = |a: &str, b: &str| {
            format!(
                "placeholders `<{a}>` and `<{b}>` need a separator such as `:` between them; without one different \
                 arguments can render the same key"
            )
        };
        assert_eq!(messages("<a><b>"), [needs("a", "b")]);
        assert_eq!(parse("<a><b>").unwrap_err()[0].range, 0..6);
        assert_eq!(messages("x:<a>-<b.c>"), [needs("a", "b.c")]);
        assert_eq!(messages("<a>_.@x9é<b>"), [needs("a", "b")]);
        assert_eq!(messages("<a>%<b>"), [needs("a", "b")]);
        for separator in [":", "/", "|", "#", " ", "-:-", "%:"] {
            assert!(
                parse(&format!("<a>{separator}<b>")).is_ok(),
                "{separator:?}"
            );
        }
    }

    #[test]
    fn rejects_control_characters_once() {
        assert_eq!(
            messages("a:\tb:\n<id>\u{85}"),
            ["key templates cannot contain control characters such as `\\t`; the runtime rejects keys that \
              contain them"]
        );
    }

    #[test]
    fn reports_every_problem() {
        assert_eq!(parse("<>:<a b>:{").unwrap_err().len(), 3);
    }

    fn signature(item: &str) -> Signature {
        syn::parse_str::<syn::ItemFn>(item).unwrap().sig
    }

    #[test]
    fn pattern_parameters_bind_their_names() {
        let params = Params::of(&signature(
            "async fn f(Path(id): Path<u64>, (a, mut b): (u32, u32), Json(Body { user, name: alias, .. }): Json<Body>, \
             whole @ Wrap(inner): Wrap, _: u8) {}",
        ));
        let names: Vec<String> = params.names.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["id", "a", "b", "user", "alias", "whole", "inner"]);
        assert!(params.receiver.is_none());
    }

    fn check(item: &str, template: &str) -> Result<Template, String> {
        let params = Params::of(&signature(item));
        let mut errors = Errors::new();
        let literal = LitStr::new(template, Span::call_site());
        let checked = Template::check(&literal, &params, &mut errors);
        errors.check(checked).map_err(|error| error.to_string())
    }

    #[test]
    fn resolves_parameters_and_receiver() {
        let template = check(
            "async fn f(&self, order: Order) {}",
            "o:<order.id>:<self.0>",
        )
        .unwrap();
        let rendered: Vec<String> = template
            .segments
            .iter()
            .map(|segment| match segment {
                Segment::Text(text) => text.clone(),
                Segment::Value { root, fields, .. } => {
                    quote::quote!(#root #(.#fields)*).to_string()
                }
            })
            .collect();
        assert_eq!(rendered, ["o:", "order . id", ":", "self . 0"]);
    }

    #[test]
    fn unknown_names_list_what_is_available() {
        assert_eq!(
            check("async fn pay(order: Order, amount: u64) {}", "<ordr.id>")
                .err()
                .unwrap(),
            "unknown parameter `ordr` in `<ordr.id>`; available parameters: `order`, `amount`"
        );
        assert_eq!(
            check("async fn pay(&self, order: Order) {}", "<x>")
                .err()
                .unwrap(),
            "unknown parameter `x` in `<x>`; available parameters: `self.<field>`, `order`"
        );
        assert_eq!(
            check("async fn tick() {}", "<x>").err().unwrap(),
            "unknown parameter `x` in `<x>`; `tick` has no parameters, so its key can only be fixed text"
        );
        assert_eq!(
            check("async fn pay(order: Order) {}", "<self.id>").err().unwrap(),
            "`<self.id>` needs a `self` receiver, which `pay` does not have; available parameters: `order`"
        );
    }
}
