//! Runnable programs live beside this file; see `[[example]]` in Cargo.toml.
