//! `cfg(distlock_test_hooks)`: the knobs and counters distlock's own test suite turns and reads
//! (`distlock::__private::raw`). They are compiled in only when the build's environment has
//! `DISTLOCK_TEST_HOOKS=1` (this repository's `.cargo/config.toml` sets it) and debug assertions
//! are on, so a dependent crate cannot turn them on, and no optimised build (an application's
//! release, the benchmark) has them.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(distlock_test_hooks)");
    println!("cargo::rerun-if-env-changed=DISTLOCK_TEST_HOOKS");
    let asked = std::env::var("DISTLOCK_TEST_HOOKS").is_ok_and(|value| value == "1");
    let debug = std::env::var_os("CARGO_CFG_DEBUG_ASSERTIONS").is_some();
    if asked && debug {
        println!("cargo::rustc-cfg=distlock_test_hooks");
    }
}
