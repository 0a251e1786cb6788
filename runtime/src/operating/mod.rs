//! What operators ask of a backend and read from it: who holds what (`operator.rs`, with the
//! raw key events engines report in `key_events.rs` and the holder labels of `label.rs`),
//! whether the servers keep locks safe (`doctor.rs`), and what locks did (`stats.rs`,
//! `metrics.rs`).

pub(crate) mod doctor;
pub(crate) mod key_events;
pub(crate) mod label;
pub(crate) mod metrics;
pub(crate) mod operator;
pub(crate) mod stats;
