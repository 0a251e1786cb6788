//! distlock's behaviour tests, one target per `*.rs` file here, each run against real servers.
//!
//! Two helper crates, one job each:
//! - `tests/support` (`distlock-test-support`): processes and the network — it starts and stops
//!   `redis-server`, Sentinel groups, clusters and Valkey on loopback by PID, speaks RESP to
//!   them, and runs the fault proxy. It knows nothing of distlock's API.
//! - `tests/common` (`mod common;` in a target): what targets share about distlock — a backend of
//!   each deployment built the same way (the conformance fixtures), the worker processes of the
//!   multi-process tests, and a lock key's value as the scripts lay it out.
//! - `tests/sql_faults` (`mod sql_faults;` in `postgres.rs` and `mysql.rs`): the PostgreSQL and
//!   MySQL tests written once, each run on both databases.
//!
//! The package lives in `tests/`, so cargo cannot find its targets by itself (`autotests` would
//! look in `tests/tests/`): each file is a `[[test]]` in `Cargo.toml`, and
//! `every_test_file_is_a_target` (below) fails naming a file that is not.

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// A test file missing from `Cargo.toml` would never run, and nothing would say so.
    #[test]
    fn every_test_file_is_a_target() {
        let dir = env!("CARGO_MANIFEST_DIR");
        let manifest = std::fs::read_to_string(format!("{dir}/Cargo.toml")).unwrap();
        let listed: BTreeSet<String> = manifest
            .lines()
            .filter_map(|line| line.trim().strip_prefix("path = \""))
            .filter_map(|path| path.strip_suffix('"'))
            .map(str::to_owned)
            .collect();
        let files: BTreeSet<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".rs") && name != "lib.rs" && name != "build.rs")
            .collect();
        let missing: Vec<_> = files.difference(&listed).collect();
        assert!(
            missing.is_empty(),
            "not a [[test]] in tests/Cargo.toml, so never run: {missing:?}"
        );
        assert!(files.len() >= 20, "found only {files:?}");
    }
}
