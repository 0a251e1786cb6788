//! Waiting for a busy lock without hammering the server and without hanging.
//!
//! - [`Gates`]: local convergence. Tasks of one process that want the same key queue here, in
//!   arrival order; only the task holding the key's [`Turn`] talks to the server.
//! - [`ReleaseWatch`]: release notifications. The contending task registers for the key's
//!   notification *before* it re-checks the lock (subscribe-before-check), so a release between
//!   "busy" and "subscribed" cannot be missed.
//! - [`Backoff`]: a notification is a hint, not a promise; full-jitter exponential backoff,
//!   bounded by the wait budget and the holder's remaining TTL, retries anyway, so a lost
//!   notification costs a bounded delay, never a hang.

mod backoff;
mod gate;
mod notify;

pub(crate) use backoff::{retry_until, Backoff};
pub(crate) use gate::{Claimed, Gates, Successor, Transferred, Turn};
pub(crate) use notify::{Channels, Lingering, OnIdleHook, ReleaseWatch};
