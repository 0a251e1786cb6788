//! The validated [`Lock`] the expansion works from, and the checks that build it.
//!
//! Validation reads the recorded [`Args`] and the annotated [`LockedFn`]; every problem goes to one
//! [`Errors`](crate::errors::Errors) sink so a user with three mistakes sees three errors in one build.

use std::time::Duration;

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::visit_mut::VisitMut;
use syn::{
    braced, Attribute, Block, Error, GenericArgument, LitStr, PathArguments, ReturnType, Signature,
    Stmt, Token, Type, Visibility,
};

use crate::args::{Arg, Args, Integer};
use crate::duration::{self, Lease, Wait};
use crate::errors::Errors;
use crate::template::{Params, Template};

/// `on_lost`: what the call does once its lease is lost (see the attribute's docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLost {
    Checkpoint,
    Abort,
    Ignore,
}

/// `mode` / `permits`: how the lock is shared between its holders (see the attribute's docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockKind {
    /// `mode = "write"`, the default: one holder, excluding readers too.
    Exclusive,
    /// `mode = "read"`: any number of readers, excluding writers.
    Read,
    /// `permits = N`: a semaphore, at most `N` (at least 1) holders at once.
    Permits(u32),
}

/// Everything the expansion needs, all of it checked.
pub(crate) struct Lock {
    pub(crate) backend: String,
    pub(crate) wait: Wait,
    pub(crate) lease: Lease,
    pub(crate) on_lost: OnLost,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) keys: Vec<Template>,
    pub(crate) kind: LockKind,
    /// The declared return type with every `impl Trait` replaced by `_`, for the fake return edge.
    pub(crate) output: Type,
    /// `E` of `Result<T, E>`, as written.
    pub(crate) error: Type,
    /// `false` when `E` contains `impl Trait`, which cannot be named in the body: `locked`'s own
    /// bound still checks the conversion, only the assert at `E` is left out.
    pub(crate) error_nameable: bool,
}

/// The annotated function, parsed so that its body's top-level statements can be reached.
pub(crate) struct LockedFn {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    pub(crate) inner_attrs: Vec<Attribute>,
    pub(crate) stmts: Vec<Stmt>,
}

impl Parse for LockedFn {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        let sig: Signature = input.parse().map_err(|error| {
            Error::new(
                error.span(),
                "#[distributed_lock] applies to an `async fn`; this item is not a function",
            )
        })?;
        if input.peek(Token![;]) {
            return Err(Error::new(
                sig.ident.span(),
                "#[distributed_lock] needs the function's body; put it on the method in the trait's `impl`, not on \
                 the declaration in the trait",
            ));
        }
        let body;
        braced!(body in input);
        let inner_attrs = body.call(Attribute::parse_inner)?;
        let stmts = body.call(Block::parse_within)?;
        Ok(LockedFn {
            attrs,
            vis,
            sig,
            inner_attrs,
            stmts,
        })
    }
}

/// Checks the arguments against the function; `None` when anything was pushed to `errors`.
pub(crate) fn validate(args: Args, function: &LockedFn, errors: &mut Errors) -> Option<Lock> {
    let shape = check_signature(&function.sig, errors);
    let keys = check_keys(&args, &function.sig, errors);
    let kind = check_kind(&args, errors);

    let wait = checked(args.wait, Wait::For(Duration::ZERO), duration::wait, errors);
    let lease = checked(args.lease, Lease::Watchdog, duration::lease, errors);
    let on_lost = checked(args.on_lost, OnLost::Checkpoint, on_lost, errors);
    let backend = checked(args.backend, "default".to_owned(), backend, errors);
    let max_hold = match args.max_hold.and_then(|arg| arg.value) {
        None => Some(None),
        Some(lit) => {
            if let Some(Lease::Fixed(_)) = lease {
                errors.push(Error::new(
                    lit.span(),
                    "`max_hold` caps the watchdog's renewals, but a fixed `lease` is never renewed; remove \
                     `max_hold` or use `lease = \"watchdog\"`",
                ));
            }
            keep(duration::max_hold(&lit), errors).map(Some)
        }
    };

    let (output, error, error_nameable) = shape?;
    Some(Lock {
        backend: backend?,
        wait: wait?,
        lease: lease?,
        on_lost: on_lost?,
        max_hold: max_hold?,
        keys: keys?,
        kind: kind?,
        output,
        error,
        error_nameable,
    })
}

/// The argument's value checked by `check`, or `default` when it was not given. A value of the
/// wrong kind was reported by `args` already; it is treated as absent so it is reported once.
fn checked<T>(
    arg: Option<Arg<LitStr>>,
    default: T,
    check: impl FnOnce(&LitStr) -> Result<T, Error>,
    errors: &mut Errors,
) -> Option<T> {
    match arg.and_then(|arg| arg.value) {
        Some(lit) => keep(check(&lit), errors),
        None => Some(default),
    }
}

fn keep<T>(result: Result<T, Error>, errors: &mut Errors) -> Option<T> {
    result.map_err(|error| errors.push(error)).ok()
}

fn on_lost(lit: &LitStr) -> Result<OnLost, Error> {
    match lit.value().as_str() {
        "checkpoint" => Ok(OnLost::Checkpoint),
        "abort" => Ok(OnLost::Abort),
        "ignore" => Ok(OnLost::Ignore),
        other => Err(Error::new(
            lit.span(),
            format!("unknown `on_lost` policy `{other}`; expected one of `checkpoint`, `abort`, `ignore`"),
        )),
    }
}

fn backend(lit: &LitStr) -> Result<String, Error> {
    let name = lit.value();
    if name.trim().is_empty() {
        return Err(Error::new(
            lit.span(),
            "empty `backend` name; expected a registry name, such as `\"default\"`",
        ));
    }
    Ok(name)
}

/// `mode` or `permits`, not both (a semaphore has no mode), and `permits` only with one `key`.
/// The conflicts are judged by the arguments' presence, so they are reported beside any error in
/// the values.
fn check_kind(args: &Args, errors: &mut Errors) -> Option<LockKind> {
    let mode = match args.mode.as_ref().and_then(|arg| arg.value.as_ref()) {
        Some(lit) => keep(mode(lit), errors).map(Some),
        None => Some(None),
    };
    let permits = match args.permits.as_ref().and_then(|arg| arg.value.as_ref()) {
        Some(integer) => keep(permits(integer), errors).map(Some),
        None => Some(None),
    };

    let mut ok = true;
    // A mode whose value is wrong has its own error; which lock it meant is unknown.
    if let (Some(mode_arg), Some(permits_arg), Some(Some(kind))) = (&args.mode, &args.permits, mode)
    {
        ok = false;
        let second = if mode_arg.position > permits_arg.position {
            &mode_arg.name
        } else {
            &permits_arg.name
        };
        let (written, lock) = match kind {
            LockKind::Read => ("read", "a shared read lock"),
            _ => ("write", "an exclusive lock"),
        };
        errors.push(Error::new(
            second.span(),
            format!(
                "`permits` and `mode` cannot be combined: `permits` makes a semaphore, which has no mode, and \
                 `mode = \"{written}\"` {lock}; pick one"
            ),
        ));
    }
    if let (Some(permits_arg), Some(_)) = (&args.permits, &args.keys) {
        ok = false;
        errors.push(Error::new(
            permits_arg.name.span(),
            "`permits` cannot be combined with `keys = [..]`: a semaphore counts the holders of one key; use \
             `key` with `permits`, or `keys` for read or write locks acquired together",
        ));
    }

    let kind = match (mode?, permits?) {
        (_, Some(permits)) => LockKind::Permits(permits),
        (Some(kind), None) => kind,
        (None, None) => LockKind::Exclusive,
    };
    ok.then_some(kind)
}

fn mode(lit: &LitStr) -> Result<LockKind, Error> {
    match lit.value().as_str() {
        "write" => Ok(LockKind::Exclusive),
        "read" => Ok(LockKind::Read),
        other => Err(Error::new(
            lit.span(),
            format!("unknown `mode` `{other}`; expected `read` or `write` (a semaphore is `permits = N`, not a mode)"),
        )),
    }
}

/// At least 1, at most `u32::MAX`, written without a sign or a type suffix.
fn permits(integer: &Integer) -> Result<u32, Error> {
    let error = |message: String| Error::new_spanned(&integer.written, message);
    let lit = &integer.lit;
    if integer.negative {
        return Err(error(
            "`permits` cannot be negative; expected how many calls may hold the lock at once, such as \
             `permits = 10`"
                .to_owned(),
        ));
    }
    if !lit.suffix().is_empty() {
        return Err(error(format!(
            "`permits = {lit}` has a type suffix; write a plain integer, such as `permits = {}`",
            lit.base10_digits()
        )));
    }
    // The digits are ASCII digits (syn checked them), so a failed parse is an overflow.
    match lit.base10_digits().parse::<u32>() {
        Ok(0) => Err(error(
            "a semaphore needs at least one permit; `permits = 0` would let no call in".to_owned(),
        )),
        Ok(permits) => Ok(permits),
        Err(_) => Err(error(format!(
            "`permits = {lit}` is more than the maximum, {} (`u32::MAX`)",
            u32::MAX
        ))),
    }
}

/// `key` xor `keys`, every template checked against the signature.
fn check_keys(args: &Args, sig: &Signature, errors: &mut Errors) -> Option<Vec<Template>> {
    let literals: Vec<LitStr> = match (&args.key, &args.keys) {
        (Some(key), Some(keys)) => {
            let second = if key.position > keys.position {
                &key.name
            } else {
                &keys.name
            };
            errors.push(Error::new(
                second.span(),
                "`key` and `keys` cannot be combined; use `key` for one lock or `keys = [..]` for several acquired \
                 together",
            ));
            return None;
        }
        (Some(key), None) => vec![key.value.clone()?],
        (None, Some(keys)) => keys.value.clone()?,
        (None, None) => {
            // No token names the missing argument; the attribute as a whole is what lacks it.
            errors.push(Error::new(
                Span::call_site(),
                "missing `key`; expected `key = \"order:<order.id>\"`, or `keys = [\"a:<x>\", \"b:<y>\"]` for several",
            ));
            return None;
        }
    };

    let params = Params::of(sig);
    let mut templates = Vec::with_capacity(literals.len());
    for (index, literal) in literals.iter().enumerate() {
        if literals[..index]
            .iter()
            .any(|earlier| earlier.value() == literal.value())
        {
            errors.push(Error::new(
                literal.span(),
                format!(
                    "duplicate key template `{}`; every key of one lock must differ",
                    literal.value()
                ),
            ));
            continue;
        }
        if let Some(template) = Template::check(literal, &params, errors) {
            templates.push(template);
        }
    }
    (templates.len() == literals.len()).then_some(templates)
}

/// An `async fn`, not `const` or `extern`, returning `Result<T, E>`: the declared output (with
/// `impl Trait` erased), `E`, and whether `E` can be named in the body.
fn check_signature(sig: &Signature, errors: &mut Errors) -> Option<(Type, Type, bool)> {
    let mut ok = true;
    if let Some(constness) = &sig.constness {
        ok = false;
        errors.push(Error::new(
            constness.span,
            "#[distributed_lock] cannot be used on a `const fn`; a lock is taken at run time, so expected an `async fn`",
        ));
    } else if let Some(abi) = &sig.abi {
        ok = false;
        errors.push(Error::new_spanned(
            abi,
            "#[distributed_lock] cannot be used on an `extern` fn; expected a Rust `async fn`",
        ));
    } else if sig.asyncness.is_none() {
        ok = false;
        errors.push(Error::new(
            sig.fn_token.span,
            "#[distributed_lock] requires an `async fn`",
        ));
    }

    let declared = match &sig.output {
        ReturnType::Type(_, ty) => ty,
        ReturnType::Default => {
            errors.push(Error::new(
                sig.ident.span(),
                "#[distributed_lock] requires a return type of `Result<T, E>` where `E: From<distlock::LockError>`; \
                 this function returns `()`",
            ));
            return None;
        }
    };
    let mut output = (**declared).clone();
    ImplTraitEraser::default().visit_type_mut(&mut output);
    match result_error_type(declared) {
        Ok(Some(error)) => {
            let mut in_error = ImplTraitEraser::default();
            in_error.visit_type_mut(&mut error.clone());
            ok.then_some((output, error.clone(), !in_error.erased))
        }
        // A `Result` alias (`io::Result<T>`, `anyhow::Result<T>`, a crate's `Result<T>`): `E` is
        // out of sight, so the checks that name it are left out; the fake return edge still pins
        // it, and `locked`'s bound (spanned at the return type) still checks the conversion.
        Ok(None) => ok.then_some((output, (**declared).clone(), false)),
        Err(message) => {
            errors.push(Error::new_spanned(declared, message));
            None
        }
    }
}

/// `E` of a return type spelled `…::Result<T, E>`; `None` for a `Result` alias with one type
/// argument (`io::Result<T>`, `anyhow::Result<T>`, `AppResult<T>`), whose `E` is out of sight.
fn result_error_type(ty: &Type) -> Result<Option<&Type>, &'static str> {
    let not_result = "#[distributed_lock] requires a return type of `Result<T, E>` where \
                      `E: From<distlock::LockError>`; a lock failure is returned as `Err(E::from(LockError))`";
    let path = match ty {
        Type::Group(group) => return result_error_type(&group.elem),
        Type::Paren(paren) => return result_error_type(&paren.elem),
        Type::Path(path) if path.qself.is_none() => &path.path,
        _ => return Err(not_result),
    };
    let last = path.segments.last().ok_or(not_result)?;
    let types: Vec<&Type> = match &last.arguments {
        PathArguments::AngleBracketed(generics) => generics
            .args
            .iter()
            .filter_map(|arg| match arg {
                GenericArgument::Type(ty) => Some(ty),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    match types.as_slice() {
        [_, error] if last.ident == "Result" => Ok(Some(error)),
        [_] if last.ident.to_string().ends_with("Result") => Ok(None),
        _ => Err(not_result),
    }
}

/// `impl Trait` cannot be named inside the body, `_` can: the fake return edge still pins `E` and
/// the shape of `T`, and the compiler infers the rest (tracing-attributes does the same).
#[derive(Default)]
struct ImplTraitEraser {
    erased: bool,
}

impl VisitMut for ImplTraitEraser {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        if let Type::ImplTrait(impl_trait) = ty {
            self.erased = true;
            *ty = Type::Infer(syn::TypeInfer {
                underscore_token: Token![_](impl_trait.impl_token.span),
            });
        } else {
            syn::visit_mut::visit_type_mut(self, ty);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    /// The kind `args` describe, or every error message they produce.
    fn kind(args: proc_macro2::TokenStream) -> Result<LockKind, Vec<String>> {
        let mut errors = Errors::new();
        let args = Args::parse(args, &mut errors);
        let kind = check_kind(&args, &mut errors);
        errors
            .check(kind)
            .map_err(|error| error.into_iter().map(|error| error.to_string()).collect())
    }

    #[test]
    fn mode_and_permits_choose_the_kind() {
        assert_eq!(kind(quote!(key = "k")), Ok(LockKind::Exclusive));
        assert_eq!(
            kind(quote!(key = "k", mode = "write")),
            Ok(LockKind::Exclusive)
        );
        assert_eq!(kind(quote!(key = "k", mode = "read")), Ok(LockKind::Read));
        assert_eq!(
            kind(quote!(keys = ["a", "b"], mode = "read")),
            Ok(LockKind::Read)
        );
        assert_eq!(
            kind(quote!(key = "k", permits = 1)),
            Ok(LockKind::Permits(1))
        );
        assert_eq!(
            kind(quote!(key = "k", permits = 4294967295)),
            Ok(LockKind::Permits(u32::MAX))
        );
        assert_eq!(
            kind(quote!(key = "k", permits = 0x10)),
            Ok(LockKind::Permits(16))
        );
    }

    #[test]
    fn permits_out_of_range_or_suffixed_are_rejected() {
        let first = |args| kind(args).unwrap_err().remove(0);
        assert!(first(quote!(permits = 0)).starts_with("a semaphore needs at least one permit"));
        assert!(first(quote!(permits = -3)).starts_with("`permits` cannot be negative"));
        assert!(first(quote!(permits = 4294967296))
            .starts_with("`permits = 4294967296` is more than the maximum"));
        assert!(first(quote!(permits = 10u32)).starts_with("`permits = 10u32` has a type suffix"));
        // A negative literal token, as a `macro_rules!` fragment or another macro can pass it.
        let negative = proc_macro2::Literal::i32_unsuffixed(-3);
        assert!(first(quote!(permits = #negative)).starts_with("`permits` cannot be negative"));
    }

    #[test]
    fn permits_has_no_mode_and_one_key() {
        for mode in ["read", "write"] {
            let message = kind(quote!(permits = 3, mode = #mode)).unwrap_err();
            assert_eq!(message.len(), 1, "{message:?}");
            assert!(message[0].starts_with("`permits` and `mode` cannot be combined"));
        }
        let message = kind(quote!(keys = ["a", "b"], permits = 3)).unwrap_err();
        assert!(message[0].starts_with("`permits` cannot be combined with `keys = [..]`"));
        // An unknown mode is one error, not a second one about the combination.
        assert_eq!(
            kind(quote!(permits = 3, mode = "reed")).unwrap_err().len(),
            1
        );
        // Every mistake at once.
        assert_eq!(
            kind(quote!(keys = ["a"], permits = 0, mode = "read"))
                .unwrap_err()
                .len(),
            3
        );
    }
}
