//! The suite turns distlock's test hooks (`distlock::__private::raw`), which runtime/build.rs
//! compiles in only for `DISTLOCK_TEST_HOOKS=1` with debug assertions on: a build without them
//! would fail on every missing hook, so it stops here and says why.

fn main() {
    println!("cargo::rerun-if-env-changed=DISTLOCK_TEST_HOOKS");
    let asked = std::env::var("DISTLOCK_TEST_HOOKS").is_ok_and(|value| value == "1");
    let debug = std::env::var_os("CARGO_CFG_DEBUG_ASSERTIONS").is_some();
    if !asked {
        panic!(
            "distlock's tests need its test hooks, and DISTLOCK_TEST_HOOKS is not 1 (this \
             repository's .cargo/config.toml sets it): run ./scripts/test.sh, or unset it"
        );
    }
    if !debug {
        panic!(
            "distlock's tests need its test hooks, which an optimised build never has: run them \
             without --release"
        );
    }
}
