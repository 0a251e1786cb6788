//! The lock protocol, model-checked: the checker and the models are the `model` test target
//! (`model.rs`); this library is empty. Run it optimised:
//! `cargo test --profile model -p distlock-model -- --nocapture`.
