//! Compile-time behaviour of `#[distributed_lock]`: every misuse in `ui/fail/` must fail with the
//! reviewed message in its `.stderr`, every case in `ui/pass/` must compile and run. The toolchain is
//! pinned (`rust-toolchain.toml`), so the messages are stable; regenerate them with
//! `TRYBUILD=overwrite cargo test -p distlock-ui-tests --test ui` and read the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/fail/*.rs");
    t.pass("ui/pass/*.rs");
}
