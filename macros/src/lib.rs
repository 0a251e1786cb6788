//! The `#[distributed_lock]` attribute of [distlock](https://docs.rs/distlock). Use it through the
//! `distlock` crate (`distlock::distributed_lock`): the code it generates calls
//! `::distlock::__private`, which only the matching `distlock` version provides.
//!
//! The crate is a pipeline of phases, one file each: `args` records the arguments as written,
//! `model` validates them together with the function (`duration` and `template` do the
//! detailed checks) into a `model::Lock`, and `expand` generates the code. Every error of one
//! attribute is reported in the same build, and on any error the function is emitted unchanged
//! beside the errors, so the rest of the crate keeps type-checking.

// Every function reads top to bottom in one screen (the threshold is in clippy.toml).
#![warn(clippy::too_many_lines)]

mod args;
mod duration;
mod errors;
mod expand;
mod model;
mod template;

use proc_macro::TokenStream;

/// Runs an `async fn` while holding a distributed lock.
///
/// The call acquires the lock (or every lock of `keys`, all or none), runs the body, and releases
/// the lock when the body finishes, returns early, fails, panics or is dropped. Lock failures are
/// returned as `Err(E::from(LockError))`, so the function must return `Result<T, E>` with
/// `E: From<distlock::LockError>`.
///
/// ```ignore
/// use distlock::{distributed_lock, LockError};
///
/// #[distributed_lock(key = "order:<order.id>", wait = "1s", lease = "watchdog")]
/// async fn pay(order: &Order, amount: u64) -> Result<Receipt, PayError> {
///     let fence = distlock::fencing_token();
///     ledger.debit(order.id, amount, fence).await?;
///     // a checkpoint runs here: if the lease was lost, the call returns Err(PayError::from(LockError::Lost { .. }))
///     ledger.credit(order.merchant, amount, fence).await?;
///     Ok(Receipt::new(order))
/// }
/// ```
///
/// # Arguments
///
/// Every argument is checked at compile time; a build reports all mistakes of one attribute.
///
/// | argument | values | default |
/// |---|---|---|
/// | `key` | a key template, such as `"order:<order.id>"` | required, unless `keys` is given |
/// | `keys` | an array of key templates, such as `["account:<from>", "account:<to>"]` | — |
/// | `mode` | `"read"` or `"write"` | `"write"` |
/// | `permits` | an integer from `1` to `u32::MAX`, such as `10` | none (no semaphore) |
/// | `wait` | `"0"`, `"forever"` or a duration | `"0"` |
/// | `lease` | `"watchdog"` or a duration of at least `100ms` | `"watchdog"` |
/// | `on_lost` | `"checkpoint"`, `"abort"` or `"ignore"` | `"checkpoint"` |
/// | `backend` | a name registered in `distlock::Registry` | `"default"` |
/// | `max_hold` | a duration of at least `100ms` | none |
///
/// - **`key`** — the lock's key. Exactly one of `key` and `keys` is given.
/// - **`keys`** — several keys locked together: all of them are acquired, in a canonical (sorted)
///   order so that two calls locking the same keys cannot deadlock, or none is. Two templates of
///   one attribute must differ.
/// - **`mode`** — `"write"`: one holder at a time, excluding readers too. `"read"`: any number of
///   readers at once, excluding writers. With `keys`, every key is locked in that mode.
/// - **`permits`** — a semaphore: at most this many calls hold the key at once. It takes one
///   `key` (not `keys`) and no `mode`.
/// - **`wait`** — how long the call waits for a busy lock before it returns `LockError::Busy`. `"0"`
///   tries once; `"forever"` never gives up. Any `wait` works with any `lease`.
/// - **`lease`** — `"watchdog"`: a short TTL the background watchdog renews while the call runs, so
///   the lock lives exactly as long as the call. A duration: a fixed lease, never renewed; the call
///   sees a lost lease once it has run that long.
/// - **`on_lost`** — what happens when the lease is lost while the body runs (renewal found another
///   owner, validity ran out):
///   - `"checkpoint"`: before every top-level statement of the body except the first, the
///     generated code checks the lease and returns `Err(E::from(LockError::Lost { .. }))` if it is
///     gone, so no further step runs without the lock. `distlock::checkpoint()?` does the same check
///     inside loops and deeper calls.
///   - `"abort"`: the body is dropped at its next `.await` once the lease is lost.
///   - `"ignore"`: the body runs to its end; the loss is logged and counted.
/// - **`backend`** — which configured backend holds the lock. A backend that was never configured
///   is `LockError::NotConfigured` at run time, never a silent in-process lock.
/// - **`max_hold`** — a liveness cap for `lease = "watchdog"`: the watchdog stops renewing after
///   this long, so a stuck call cannot hold the lock forever; the body then sees a lost lease. A
///   fixed `lease` is never renewed, so it does not take `max_hold`.
///
/// ```ignore
/// #[distributed_lock(key = "doc:<id>", mode = "read")]
/// async fn render(id: u64) -> Result<Html, AppError> { /* many at once, never during a write */ }
///
/// #[distributed_lock(key = "api:<tenant>", permits = 10, wait = "5s")]
/// async fn call_api(tenant: &str) -> Result<Reply, AppError> { /* at most 10 calls per tenant */ }
/// ```
///
/// A duration is an integer followed by one unit: `ms`, `s`, `m` or `h`, such as `"250ms"`, `"1s"`,
/// `"2m"`, `"1h"`; `"0"` needs no unit. No spaces, signs, fractions or units below a millisecond.
///
/// # Key templates
///
/// Text is copied into the key verbatim; a placeholder in `<…>` is replaced by a value rendered
/// with `Display`:
///
/// - `<id>` — a parameter, or a name bound inside a parameter pattern
///   (`Path(id): Path<u64>`, `(a, b): (u32, u32)`, `Json(Body { user, .. }): Json<Body>`);
/// - `<order.id>`, `<pair.0>` — a field path of one;
/// - `<self.tenant>` — a field of the receiver (`<self>` alone is not accepted: name the field
///   that identifies the resource).
///
/// The runtime escapes every character of a rendered value as `%XX` except ASCII letters and
/// digits, `_`, `.`, `-`, `@` and non-ASCII printable characters, so a value cannot forge a
/// separator or a Redis Cluster hash tag. For the same reason two placeholders need a separator
/// with at least one character a rendered value cannot contain (not one of those, and not `%`),
/// such as `:` or `/`: `"<a>-<b>"` is rejected, since `("x-y", "z")` and `("x", "y-z")` would
/// render the same key. A template cannot contain `{` or `}` (the runtime adds the hash tag) or
/// control characters, and cannot write `<` or `>` as text.
///
/// The keys are rendered from borrows of the arguments before the body runs, so the body may
/// still move them.
///
/// # Errors
///
/// Besides the body's own errors, the generated function returns `Err(E::from(err))` for these
/// `LockError`s (those of `distlock::Lock::run`):
///
/// - `LockError::Busy` — the lock stayed held by someone else for the whole `wait` (or at the
///   one try made without a `wait`);
/// - `LockError::Lost` — the lease was lost while the body ran: with `on_lost = "checkpoint"`,
///   at the next checkpoint; with `"abort"`, once the loss is detected (the body is dropped);
///   never with `"ignore"`;
/// - `LockError::NotConfigured` — `backend` names a backend that is not registered (for
///   `"default"`: nor set by `DISTLOCK_URL`);
/// - `LockError::InvalidConfig` — `"default"`, built from the environment at its first use, found
///   a bad variable (the error names it);
/// - `LockError::InvalidKey` — a rendered key is empty or longer than the backend's
///   `max_key_len`;
/// - `LockError::NestedKind` — an enclosing locked call of the same task holds a key in a way
///   that does not cover this lock (a write lock inside a read lock, a semaphore and a lock on
///   one key);
/// - `LockError::ShutDown` — the backend was shut down;
/// - `LockError::ReplicasNotAcknowledged` — with `min_replicas`, too few replicas acknowledged
///   the grant in time;
/// - `LockError::Backend` — the server failed and the wait budget is spent, or it refused the
///   release notifications a waiting call subscribes to.
///
/// Mistakes in the attribute's arguments are compile errors, never one of these.
///
/// # Panics
///
/// As `distlock::Lock::acquire`: the generated future panics when polled outside a Tokio
/// runtime (taking a lock may start the backend's watchdog task), and, when it has to wait, on a
/// runtime built without its time driver.
///
/// # Cancel safety
///
/// Cancel safe for the lock; the work is only as cancel safe as the body, which is dropped at
/// the `.await` it has reached. The generated future can be dropped at any point — a web handler
/// whose client disconnected, `tokio::time::timeout`, `select!` — and no lock stays held for
/// longer than one round trip plus a small margin: an acquire whose request may have run on the
/// server is released in the background with its owner token, a body that was running stops
/// being renewed at once and its lock is released in the background, a release in flight is
/// finished in the background, and the next task of this process waiting for the key gets its
/// turn. The background work runs on the current tokio runtime; if none is left (the runtime is
/// shutting down), the lock expires by its TTL, counted in `Backend::stats().left_to_expire`.
/// See `distlock::Lock::run`.
///
/// # What the function must look like
///
/// - an `async fn` — free function, inherent method or trait-impl method (`async fn` in traits) —
///   not `const`, not `extern`; generics, where-clauses, receivers, lifetimes, attributes,
///   `#[must_use]` and doc comments are kept as written;
/// - returning `Result<T, E>` where `E: From<distlock::LockError>`, or an alias of it with one
///   parameter — `anyhow::Result<T>`, `std::io::Result<T>` (distlock converts `LockError` into
///   `io::Error`), a crate's own `Result<T>`; `T` may be `impl Trait`;
/// - `return` and `?` in the body keep their meaning: they leave the body, and the lock is still
///   released.
///
/// Write `#[distributed_lock]` above other attribute macros that rewrite the body (such as
/// `#[tracing::instrument]`): attributes expand top-down, so it then sees the body as written and
/// puts its checkpoints between your statements, and the attributes below wrap the whole locked
/// call. Do not combine it with `#[async_trait]`, which turns the `async fn` into a plain `fn`;
/// use `async fn` in traits instead. The generated code names the runtime `::distlock`, so the
/// dependency must keep that name.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    lock(args.into(), item.into()).into()
}

/// parse → validate → expand. On any error the item is emitted unchanged beside the errors: with
/// the function gone, every caller would report a second, misleading "cannot find function" error.
fn lock(
    args: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> proc_macro2::TokenStream {
    let mut errors = errors::Errors::new();
    let args = args::Args::parse(args, &mut errors);
    let lock = match syn::parse2::<model::LockedFn>(item.clone()) {
        Ok(function) => model::validate(args, &function, &mut errors).map(|lock| (lock, function)),
        Err(error) => {
            errors.push(error);
            None
        }
    };
    match errors.check(lock) {
        Ok((lock, function)) => expand::expand(&lock, function),
        Err(error) => {
            // The function stays as written, so the rest of the crate (and the IDE) still
            // type-check against it.
            let mut unchanged = item;
            unchanged.extend(error.into_compile_error());
            unchanged
        }
    }
}
