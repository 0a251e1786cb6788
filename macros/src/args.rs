//! Attribute arguments as written: each recorded with its name's span, unknown and duplicate names
//! rejected, values checked for their kind only (string literal, array of string literals, integer
//! literal). What the values mean is [`crate::model`]'s business.

use proc_macro2::TokenStream;
use syn::meta::ParseNestedMeta;
use syn::parse::Parser;
use syn::{Error, Expr, ExprLit, ExprUnary, Ident, Lit, LitInt, LitStr, Token, UnOp};

use crate::errors::Errors;

/// Every argument, in the order the docs and the "expected one of" list present them.
const NAMES: &str =
    "`key`, `keys`, `mode`, `permits`, `wait`, `lease`, `on_lost`, `backend`, `max_hold`";

/// One argument as written.
pub(crate) struct Arg<T> {
    pub(crate) name: Ident,
    /// Index among the attribute's arguments, to tell which of two conflicting ones came second.
    pub(crate) position: usize,
    /// `None` when the value had the wrong kind; that error is already recorded.
    pub(crate) value: Option<T>,
}

/// An integer literal as written, sign included: `10`, `-3`.
pub(crate) struct Integer {
    /// The whole value, minus sign included, for spans.
    pub(crate) written: Expr,
    pub(crate) negative: bool,
    pub(crate) lit: LitInt,
}

#[derive(Default)]
pub(crate) struct Args {
    pub(crate) key: Option<Arg<LitStr>>,
    pub(crate) keys: Option<Arg<Vec<LitStr>>>,
    pub(crate) mode: Option<Arg<LitStr>>,
    pub(crate) permits: Option<Arg<Integer>>,
    pub(crate) wait: Option<Arg<LitStr>>,
    pub(crate) lease: Option<Arg<LitStr>>,
    pub(crate) on_lost: Option<Arg<LitStr>>,
    pub(crate) backend: Option<Arg<LitStr>>,
    pub(crate) max_hold: Option<Arg<LitStr>>,
    count: usize,
}

impl Args {
    /// Records every argument it can; a syntax error that stops the parser is recorded too.
    pub(crate) fn parse(tokens: TokenStream, errors: &mut Errors) -> Args {
        let mut args = Args::default();
        let parser = syn::meta::parser(|meta| args.argument(&meta, errors));
        if let Err(error) = parser.parse2(tokens) {
            errors.push(error);
        }
        args
    }

    fn argument(&mut self, meta: &ParseNestedMeta<'_>, errors: &mut Errors) -> syn::Result<()> {
        let position = self.count;
        self.count += 1;
        let Some(name) = meta.path.get_ident().cloned() else {
            return unknown(meta, errors);
        };
        match name.to_string().as_str() {
            "key" => {
                let value = string(meta, &name, "key = \"order:<order.id>\"", errors)?;
                set(&mut self.key, name, position, value, errors);
            }
            "keys" => {
                let value = string_array(meta, &name, errors)?;
                set(&mut self.keys, name, position, value, errors);
            }
            "mode" => {
                let value = string(meta, &name, "mode = \"read\"", errors)?;
                set(&mut self.mode, name, position, value, errors);
            }
            "permits" => {
                let value = integer(meta, &name, "permits = 10", errors)?;
                set(&mut self.permits, name, position, value, errors);
            }
            "wait" => {
                let value = string(meta, &name, "wait = \"1s\"", errors)?;
                set(&mut self.wait, name, position, value, errors);
            }
            "lease" => {
                let value = string(meta, &name, "lease = \"watchdog\"", errors)?;
                set(&mut self.lease, name, position, value, errors);
            }
            "on_lost" => {
                let value = string(meta, &name, "on_lost = \"checkpoint\"", errors)?;
                set(&mut self.on_lost, name, position, value, errors);
            }
            "backend" => {
                let value = string(meta, &name, "backend = \"default\"", errors)?;
                set(&mut self.backend, name, position, value, errors);
            }
            "max_hold" => {
                let value = string(meta, &name, "max_hold = \"5m\"", errors)?;
                set(&mut self.max_hold, name, position, value, errors);
            }
            _ => return unknown(meta, errors),
        }
        Ok(())
    }
}

/// The one place that records an argument, so the duplicate check cannot test the wrong field.
fn set<T>(
    slot: &mut Option<Arg<T>>,
    name: Ident,
    position: usize,
    value: Option<T>,
    errors: &mut Errors,
) {
    if slot.is_some() {
        errors.push(Error::new(
            name.span(),
            format!("duplicate argument `{name}`"),
        ));
    } else {
        *slot = Some(Arg {
            name,
            position,
            value,
        });
    }
}

fn unknown(meta: &ParseNestedMeta<'_>, errors: &mut Errors) -> syn::Result<()> {
    let written: Vec<String> = meta
        .path
        .segments
        .iter()
        .map(|segment| segment.ident.to_string())
        .collect();
    errors.push(Error::new_spanned(
        &meta.path,
        format!(
            "unknown argument `{}`; expected one of {NAMES}",
            written.join("::")
        ),
    ));
    // Consume whatever value it has so that the arguments after it are still checked.
    value(meta, errors, None).map(drop)
}

/// The expression after `=`, or `None` when there is none (an error when the argument `needs` one).
fn value(
    meta: &ParseNestedMeta<'_>,
    errors: &mut Errors,
    needs: Option<(&Ident, &str)>,
) -> syn::Result<Option<Expr>> {
    if meta.input.peek(Token![=]) {
        return meta.value()?.parse().map(Some);
    }
    if let Some((name, example)) = needs {
        errors.push(Error::new(
            name.span(),
            format!("`{name}` needs a value, such as `{example}`"),
        ));
    }
    // `name(…)`: skip the group.
    if meta.input.peek(syn::token::Paren) {
        meta.input.parse::<proc_macro2::Group>()?;
    }
    Ok(None)
}

fn string(
    meta: &ParseNestedMeta<'_>,
    name: &Ident,
    example: &str,
    errors: &mut Errors,
) -> syn::Result<Option<LitStr>> {
    let Some(expr) = value(meta, errors, Some((name, example)))? else {
        return Ok(None);
    };
    let lit = string_literal(&expr);
    if lit.is_none() {
        let message = format!("`{name}` expects a string literal, such as `{example}`");
        errors.push(Error::new_spanned(expr, message));
    }
    Ok(lit)
}

/// `"…"` as written, without attributes — also when a `macro_rules!` macro passed it in as a
/// `$value:literal` or `$value:expr` fragment (an invisible group around the literal).
fn string_literal(expr: &Expr) -> Option<LitStr> {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit),
            attrs,
        }) if attrs.is_empty() => Some(lit.clone()),
        Expr::Group(group) if group.attrs.is_empty() => string_literal(&group.expr),
        _ => None,
    }
}

fn integer(
    meta: &ParseNestedMeta<'_>,
    name: &Ident,
    example: &str,
    errors: &mut Errors,
) -> syn::Result<Option<Integer>> {
    let Some(expr) = value(meta, errors, Some((name, example)))? else {
        return Ok(None);
    };
    let Some((negative, lit)) = integer_literal(&expr) else {
        let message = match string_literal(&expr) {
            // `permits = "10"`: the number is right, only the quotes are not.
            Some(quoted) if quoted.value().parse::<u64>().is_ok() => format!(
                "`{name}` expects an integer literal, not a string; write `{name} = {}`",
                quoted.value()
            ),
            _ => format!("`{name}` expects an integer literal, such as `{example}`"),
        };
        errors.push(Error::new_spanned(expr, message));
        return Ok(None);
    };
    Ok(Some(Integer {
        written: expr,
        negative,
        lit,
    }))
}

/// `10` or `-10` as written (whether it is negative, and the literal), also when a
/// `macro_rules!` macro passed it in as a fragment. syn keeps the sign inside a negative literal
/// token (`Literal::i32_unsuffixed(-3)`), so the digits are checked for it too.
fn integer_literal(expr: &Expr) -> Option<(bool, LitInt)> {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(lit),
            attrs,
        }) if attrs.is_empty() => Some((lit.base10_digits().starts_with('-'), lit.clone())),
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_),
            expr,
            attrs,
        }) if attrs.is_empty() => match integer_literal(expr)? {
            (false, lit) => Some((true, lit)),
            // `--3` is not a literal.
            (true, _) => None,
        },
        Expr::Group(group) if group.attrs.is_empty() => integer_literal(&group.expr),
        _ => None,
    }
}

fn string_array(
    meta: &ParseNestedMeta<'_>,
    name: &Ident,
    errors: &mut Errors,
) -> syn::Result<Option<Vec<LitStr>>> {
    const EXAMPLE: &str = "keys = [\"account:<from>\", \"account:<to>\"]";
    let Some(expr) = value(meta, errors, Some((name, EXAMPLE)))? else {
        return Ok(None);
    };
    let Expr::Array(array) = expr else {
        errors.push(Error::new_spanned(
            expr,
            format!("`keys` expects an array of string literals, such as `{EXAMPLE}`"),
        ));
        return Ok(None);
    };
    if array.elems.is_empty() {
        errors.push(Error::new(
            array.bracket_token.span.join(),
            format!("`keys` needs at least one key template, such as `{EXAMPLE}`"),
        ));
        return Ok(None);
    }
    let written = array.elems.len();
    let mut templates = Vec::with_capacity(written);
    for elem in array.elems {
        match string_literal(&elem) {
            Some(lit) => templates.push(lit),
            None => errors.push(Error::new_spanned(
                elem,
                format!("every key in `keys` must be a string literal, such as `{EXAMPLE}`"),
            )),
        }
    }
    Ok((templates.len() == written).then_some(templates))
}
