//! Code generation only: everything here was validated by [`crate::model`].
//!
//! Input: a [`Lock`] and the annotated function, such as
//!
//! ```text
//! #[distributed_lock(key = "order:<order.id>", wait = "1s")]
//! pub async fn pay(order: &Order, amount: u64) -> Result<Receipt, PayError> {
//!     debit(order, amount).await?;
//!     credit(order, amount).await
//! }
//! ```
//!
//! Output: the same attributes and signature (still an `async fn`); the body renders the keys from
//! borrows of the arguments, then runs the original statements inside `async move` under the lock:
//!
//! ```text
//! pub async fn pay(order: &Order, amount: u64) -> Result<Receipt, PayError> {
//!     static __DISTLOCK_SPEC: ::distlock::__private::Spec = ::distlock::__private::Spec { backend: "default", template: "order:<order.id>", .. };
//!     ::distlock::__private::assert_from_lock_error::<PayError>();
//!     let __distlock_keys = ::std::vec![{
//!         let mut __distlock_key = ::distlock::__private::KeyBuilder::new();
//!         __distlock_key.literal("order:");
//!         __distlock_key.value(&order.id);
//!         __distlock_key.finish()
//!     }];
//!     ::distlock::__private::locked(&__DISTLOCK_SPEC, __distlock_keys, async move {
//!         if false { let __distlock_fake_return: Result<Receipt, PayError> = loop {}; return __distlock_fake_return; }
//!         debit(order, amount).await?;
//!         if let Err(__distlock_lost) = ::distlock::__private::checkpoint() { return Err(From::from(__distlock_lost)); }
//!         credit(order, amount).await
//!     })
//!     .await
//! }
//! ```
//!
//! Why this shape:
//! - The keys are rendered before the body exists, from borrows, so the body may still move the
//!   arguments; the rendered `String`s own nothing of the caller's.
//! - The body stays a block of its own (`async move`), so `return` and `?` leave the body, never the
//!   lock handling around it, and the release cannot be skipped.
//! - The fake return edge comes first in that block: it fixes the block's output to the declared
//!   return type before any `?` in the body needs to know which error type to convert into.
//! - Generated locals are `__distlock_*` at `Span::mixed_site()`, paths are absolute, so neither
//!   can collide with the user's names.

use proc_macro2::{Delimiter, Group, Literal, Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Ident, Stmt};

use crate::duration::{Lease, Wait};
use crate::model::{Lock, LockKind, LockedFn, OnLost};
use crate::template::{Segment, Template};

pub(crate) fn expand(lock: &Lock, function: LockedFn) -> TokenStream {
    let LockedFn {
        attrs,
        vis,
        sig,
        inner_attrs,
        stmts,
    } = function;
    let spec_name = Ident::new("__DISTLOCK_SPEC", Span::mixed_site());
    let keys_name = Ident::new("__distlock_keys", Span::mixed_site());
    let spec = spec(lock);
    let keys = lock.keys.iter().map(key);
    let body = body(lock, stmts);

    // Every obligation `E: From<LockError>` (the assert, `locked`'s bound, each checkpoint's
    // conversion) is spanned exactly at `E`: rustc reports an unsatisfied predicate once per span,
    // so a missing conversion is one error at the error type, not one per use.
    let error = &lock.error;
    let at_error = error.span();
    let assert = lock.error_nameable.then(
        || quote_spanned!(at_error=> ::distlock::__private::assert_from_lock_error::<#error>();),
    );
    let mut call_args = Group::new(
        Delimiter::Parenthesis,
        quote!(&#spec_name, #keys_name, async move { #body }),
    );
    call_args.set_span(at_error);
    // `.await` included: the bound is checked again where the returned future is awaited.
    let locked = quote_spanned!(at_error=> ::distlock::__private::locked #call_args.await);

    quote! {
        #(#attrs)*
        #vis #sig {
            #(#inner_attrs)*
            static #spec_name: ::distlock::__private::Spec = #spec;
            #assert
            let #keys_name: ::std::vec::Vec<::std::string::String> = ::std::vec![#(#keys),*];
            #locked
        }
    }
}

fn spec(lock: &Lock) -> TokenStream {
    let private = quote!(::distlock::__private);
    let nanos = |duration: std::time::Duration| {
        // model::validate guarantees every duration fits u64 nanoseconds.
        let nanos = Literal::u64_suffixed(u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX));
        quote!(#private::Duration::from_nanos(#nanos))
    };
    let backend = &lock.backend;
    let wait = match lock.wait {
        Wait::For(duration) => {
            let duration = nanos(duration);
            quote!(#private::Wait::For(#duration))
        }
        Wait::Forever => quote!(#private::Wait::Forever),
    };
    let lease = match lock.lease {
        Lease::Watchdog => quote!(#private::Lease::Watchdog),
        Lease::Fixed(duration) => {
            let duration = nanos(duration);
            quote!(#private::Lease::Fixed(#duration))
        }
    };
    let on_lost = match lock.on_lost {
        OnLost::Checkpoint => quote!(#private::OnLost::Checkpoint),
        OnLost::Abort => quote!(#private::OnLost::Abort),
        OnLost::Ignore => quote!(#private::OnLost::Ignore),
    };
    // The metrics' `lock` label: bounded by the code, unlike the rendered keys.
    let template = lock
        .keys
        .iter()
        .map(|key| key.text.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let max_hold = match lock.max_hold {
        Some(duration) => {
            let duration = nanos(duration);
            quote!(::core::option::Option::Some(#duration))
        }
        None => quote!(::core::option::Option::None),
    };
    let kind = lock.kind;
    quote! {
        #private::Spec { backend: #backend, wait: #wait, lease: #lease, on_lost: #on_lost, max_hold: #max_hold, template: #template, kind: #kind }
    }
}

/// The spec's `kind`, a const expression of the runtime's `LockKind`.
impl ToTokens for LockKind {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        tokens.extend(match self {
            LockKind::Exclusive => quote!(::distlock::__private::LockKind::Exclusive),
            LockKind::Read => quote!(::distlock::__private::LockKind::Read),
            LockKind::Permits(permits) => {
                let permits = Literal::u32_suffixed(*permits);
                quote!(::distlock::__private::LockKind::Permits(#permits))
            }
        });
    }
}

/// One `String`, rendered by the runtime's `KeyBuilder`.
fn key(template: &Template) -> TokenStream {
    let builder = Ident::new("__distlock_key", Span::mixed_site());
    let parts = template.segments.iter().map(|segment| match segment {
        Segment::Text(text) => quote!(#builder.literal(#text);),
        Segment::Value { root, fields, span } => {
            // Spanned at the template: "no field `x` on type `Order`" and "`T` doesn't implement
            // `Display`" point at the placeholder that asked for it.
            let value = quote_spanned!(*span=> &#root #(.#fields)*);
            quote!(#builder.value(#value);)
        }
    });
    quote! {
        {
            let mut #builder = ::distlock::__private::KeyBuilder::new();
            #(#parts)*
            #builder.finish()
        }
    }
}

/// The fake return edge, then the original statements, with a checkpoint between each two in
/// `on_lost = "checkpoint"` mode.
fn body(lock: &Lock, stmts: Vec<Stmt>) -> TokenStream {
    let output = &lock.output;
    let fake_return = Ident::new("__distlock_fake_return", Span::mixed_site());
    // Spanned at the return type, so a body whose value does not match it is reported there too.
    let fake_return_edge = quote_spanned! {output.span()=>
        #[allow(
            unreachable_code,
            clippy::diverging_sub_expression,
            clippy::empty_loop,
            clippy::let_unit_value,
            clippy::let_with_type_underscore,
            clippy::needless_return,
            clippy::unreachable
        )]
        if false {
            let #fake_return: #output = loop {};
            return #fake_return;
        }
    };

    let mut tokens = fake_return_edge;
    let mut first = true;
    for stmt in stmts {
        // An item is not a step of the body; a checkpoint before it would check nothing new.
        if lock.on_lost == OnLost::Checkpoint && !matches!(stmt, Stmt::Item(_)) {
            if !first {
                tokens.extend(checkpoint(lock, stmt.span()));
            }
            first = false;
        }
        stmt.to_tokens(&mut tokens);
    }
    tokens
}

/// The check before `next`: returns `Err(E::from(lost))` when the lease is gone.
fn checkpoint(lock: &Lock, next: Span) -> TokenStream {
    // `From::from` rather than `?`: the same predicate as the assert's, at the same span, so it
    // shares the assert's single error (`?` would report its own, differently worded one). rustc
    // reports it at the argument, so the local is spanned at `E` too; nothing of the user's is in
    // scope of this `if let`, so the name cannot collide.
    let at_error = lock.error.span();
    let lost = Ident::new("__distlock_lost", at_error);
    let from = quote_spanned!(at_error=> ::core::convert::From::from);
    // Spanned at the statement it guards: after a diverging statement (`return …;`) this check is
    // the first unreachable one, and rustc's "unreachable statement" then points at the user's next
    // statement, as it would without the macro.
    // `useless_conversion`: `E` may be `LockError` itself.
    quote_spanned! {next=>
        #[allow(clippy::question_mark, clippy::useless_conversion)]
        if let ::core::result::Result::Err(#lost) = ::distlock::__private::checkpoint() {
            return ::core::result::Result::Err(#from(#lost));
        }
    }
}
