//! The trybuild cases of `#[distributed_lock]` live in `ui/` and run from `ui.rs`; this crate
//! has no code of its own.
