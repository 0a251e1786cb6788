//! Runnable programs live beside this file; see `[[example]]` in Cargo.toml. Code that a program
//! and a test share lives here.

pub mod bank;
