//! The benchmark works: `--smoke` runs every workload for every library once, at sizes that
//! finish in seconds, and ends with a JSON line that parses. Its numbers mean nothing and are not
//! checked here; BENCHMARKS.md has the real run.

use serde_json::Value;
use std::process::Command;

const SECTIONS: [&str; 10] = [
    "sequential",
    "parallel",
    "contended",
    "contended_processes",
    "contended_3_processes",
    "contended_6_processes",
    "held",
    "attribute",
    "redlock_sequential",
    "redlock_contended",
];

#[test]
fn smoke_run_ends_with_a_json_line_that_parses() {
    let output = Command::new(env!("CARGO_BIN_EXE_distlock-bench"))
        .arg("--smoke")
        .output()
        .expect("distlock-bench runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "distlock-bench --smoke exited with {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let line = stdout.lines().last().expect("at least one line of output");
    let json: Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("the last line is not JSON ({e}): {line}"));

    assert_eq!(json["bench"], "distlock-bench");
    assert_eq!(json["smoke"], true);
    assert!(
        json["floor"]["rtt_set_per_s"]
            .as_f64()
            .is_some_and(|r| r > 0.0),
        "{json}"
    );
    for section in SECTIONS {
        let distlock = &json["results"][section]["distlock"];
        assert!(
            distlock.is_object() && distlock.get("na").is_none(),
            "{section}: distlock has no result: {distlock}"
        );
    }
    for section in &SECTIONS[..7] {
        let rslock = &json["results"][section]["rslock"];
        assert!(
            rslock.is_object() && rslock.get("na").is_none(),
            "{section}: rslock has no result: {rslock}"
        );
    }
    // redlock cannot hold a lease past its TTL; every other workload has a row for it.
    for section in &SECTIONS[..6] {
        let redlock = &json["results"][section]["redlock"];
        assert!(
            redlock.is_object() && redlock.get("na").is_none(),
            "{section}: redlock has no result: {redlock}"
        );
    }
    assert!(json["results"]["held"]["redlock"]["na"].is_string());
    // The FIFO floor runs beside the libraries in the contended workloads, and is a lock: no two
    // of its holders ever overlap.
    for section in &SECTIONS[2..6] {
        let floor = &json["results"][section]["fifo-floor"];
        assert!(
            floor["critical_sections"].as_f64().is_some_and(|n| n > 0.0),
            "{section}: the FIFO floor has no result: {floor}"
        );
        assert_eq!(floor["violations"], 0.0, "{section}: {floor}");
    }
    assert!(json["results"]["sequential"]["fifo-floor"].is_null());
    // The servers of their own: etcd's, PostgreSQL's, MariaDB's and ZooKeeper's sections have
    // both rows.
    for (section, peer) in [
        ("etcd_sequential", "etcd-lock"),
        ("etcd_contended", "etcd-lock"),
        ("postgres_sequential", "distributed-lock-pg"),
        ("postgres_contended", "distributed-lock-pg"),
        ("mysql_sequential", "distributed-lock-mysql"),
        ("mysql_contended", "distributed-lock-mysql"),
        ("zookeeper_sequential", "zookeeper-client"),
        ("zookeeper_contended", "zookeeper-client"),
    ] {
        for lib in ["distlock", peer] {
            let row = &json["results"][section][lib];
            assert!(
                row.is_object() && row.get("na").is_none(),
                "{section}: {lib} has no result: {row}"
            );
        }
    }
    for section in [
        "postgres_contended",
        "mysql_contended",
        "zookeeper_contended",
    ] {
        assert_eq!(
            json["results"][section]["distlock"]["violations"], 0.0,
            "{section}: {json}"
        );
    }
    // The multi-process sections count sections per process, one count per process.
    for (section, processes) in [
        ("contended_processes", 2),
        ("contended_3_processes", 3),
        ("contended_6_processes", 6),
    ] {
        let distlock = &json["results"][section]["distlock"];
        let counts = distlock["process_counts"].as_array();
        assert_eq!(
            counts.map(Vec::len),
            Some(processes),
            "{section}: {distlock}"
        );
        for key in [
            "process_share_min",
            "process_share_max",
            "wait_max_us_worst",
        ] {
            assert!(distlock[key].is_number(), "{section}: no {key}: {distlock}");
        }
    }
    // The counts workload counts every library's context switches and server commands (a smoke
    // run skips callgrind): two client commands a cycle for each, a script among them.
    for lib in ["distlock", "distlock-fixed", "rslock", "redis-rs"] {
        let row = &json["results"]["counts"][lib];
        assert!(
            row["context_switches_per_cycle"].is_number()
                && row["client_cmds_per_cycle"]
                    .as_f64()
                    .is_some_and(|n| (2.0..2.2).contains(&n)),
            "counts: {lib}: {row}"
        );
    }
    assert!(
        json["targets"].as_array().is_some_and(|t| !t.is_empty()),
        "no targets in {json}"
    );
}

/// `--pin split` puts the servers on CPU 0 and the client, with every process it starts, on CPU
/// 1, and the JSON line says where the kernel let each run. (The machine needs two CPUs, as
/// every machine this suite runs on has.)
#[test]
fn a_pinned_run_keeps_client_and_server_on_their_cpus() {
    let output = Command::new(env!("CARGO_BIN_EXE_distlock-bench"))
        .args([
            "--smoke",
            "--pin",
            "split",
            "--only",
            "sequential",
            "--libs",
            "distlock",
        ])
        .output()
        .expect("distlock-bench runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "distlock-bench --pin split exited with {}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let line = stdout.lines().last().expect("at least one line of output");
    let json: Value = serde_json::from_str(line).expect("the last line is JSON");
    assert_eq!(json["placement"]["pin"], "split", "{json}");
    assert_eq!(json["placement"]["client_cpus"], "1", "{json}");
    assert_eq!(json["placement"]["server_cpus"], "0", "{json}");
}
