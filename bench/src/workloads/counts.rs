//! Workload 13 (`--only counts`): what one uncontended cycle (acquire + release of a fresh key by
//! one task) costs, counted rather than timed, so that a noisy machine gives the same answer
//! twice: the client's instructions (callgrind), its threads' context switches, and the server's
//! commands and µs (`INFO commandstats`), for distlock beside rslock and the redis-rs floor (a
//! hand-written `SET NX PX` and compare-and-delete script).
//!
//! Every count runs in a child process of its own, this binary again (`--count`), on a runtime
//! like `#[tokio::main]`'s: under `valgrind --tool=callgrind` for [`SHORT`] and for [`LONG`]
//! cycles, so that start-up, connecting and warming up cancel out of the difference; and once
//! natively for [`NATIVE`] cycles, which reads its threads' context switches from `/proc` before
//! and after while this process reads the server's `commandstats` around it (divided by every
//! cycle the child ran, its warm-up's included). The callgrind
//! files of the long runs stay in a directory the JSON line names, for `callgrind_annotate`.

use crate::calibrate::{calibrate, Shape};
use crate::clients::{Client, LibId, WARM_UP_CYCLES};
use crate::server_stats::{self, Window};
use crate::workloads::Outcome;
use distlock_test_support::RedisServer;
use serde_json::Map;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// Cycles of the short and the long callgrind run.
const SHORT: u64 = 500;
const LONG: u64 = 1500;
/// Cycles of the native run (context switches, server counts).
const NATIVE: u64 = 5000;

/// The libraries counted, in the table's order.
pub(crate) const LIBS: [LibId; 5] = [
    LibId::Distlock,
    LibId::DistlockFixed,
    LibId::DistlockUnfenced,
    LibId::Rslock,
    LibId::RedisRs,
];

/// The child of the counts workload: `--count --lib L --url U --cycles N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CountArgs {
    pub(crate) lib: LibId,
    pub(crate) url: String,
    pub(crate) cycles: u64,
}

impl CountArgs {
    /// The arguments that make `cli::parse` produce `self` again in the child process.
    pub(crate) fn to_args(&self) -> Vec<String> {
        vec![
            "--count".into(),
            "--lib".into(),
            self.lib.name().into(),
            "--url".into(),
            self.url.clone(),
            "--cycles".into(),
            self.cycles.to_string(),
        ]
    }
}

/// Counts every library of [`LIBS`] on `server`; `smoke` runs the native count only, briefly.
pub(crate) async fn run(server: &RedisServer, smoke: bool) -> Vec<(LibId, Outcome)> {
    let dir = std::env::temp_dir().join(format!("distlock-bench-counts-{}", std::process::id()));
    let mut rows = Vec::new();
    for lib in LIBS {
        rows.push((lib, count(server, lib, &dir, smoke).await));
    }
    let reference = rows.iter().find_map(|(lib, outcome)| match (lib, outcome) {
        (LibId::Rslock, Ok(result)) => result.get("instructions_per_cycle")?.as_f64(),
        _ => None,
    });
    for (_, outcome) in &mut rows {
        if let (Ok(result), Some(reference)) = (outcome, reference) {
            if let Some(mine) = result
                .get("instructions_per_cycle")
                .and_then(|v| v.as_f64())
            {
                result.insert(
                    "instructions_ratio_to_rslock".into(),
                    (mine / reference).into(),
                );
            }
        }
    }
    rows
}

/// One library's counts.
async fn count(server: &RedisServer, lib: LibId, dir: &Path, smoke: bool) -> Outcome {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let args = |cycles| CountArgs {
        lib,
        url: server.url(),
        cycles,
    };
    let client = Arc::new(Client::connect(lib, &server.url())?);
    client.warm_up("counts").await?;
    let origins = calibrate(server, &client, Shape::Uncontended).await?;
    let cycles = if smoke { SHORT / 10 } else { NATIVE };
    server_stats::flush(server);
    let window = Window::open(server);
    let (voluntary, involuntary) = run_child(Command::new(&exe), &args(cycles))?;
    let delta = window.close(server);
    let mut result = Map::new();
    result.insert("cycles".into(), cycles.into());
    let per_cycle = |n: u64| n as f64 / cycles as f64;
    result.insert("wakeups_per_cycle".into(), per_cycle(voluntary).into());
    result.insert(
        "preemptions_per_cycle".into(),
        per_cycle(involuntary).into(),
    );
    result.insert(
        "context_switches_per_cycle".into(),
        per_cycle(voluntary + involuntary).into(),
    );
    // The server's counts include the child's warm-up cycles, as many as the counted ones.
    let server_cycles = cycles + WARM_UP_CYCLES;
    delta.record_costs(&mut result, &origins, server_cycles, "cycle", None);
    if smoke {
        return Ok(result);
    }
    // Without valgrind (or a profile), the other counts stand and the reason is recorded.
    let counted = std::fs::create_dir_all(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))
        .and_then(|()| instructions(&exe, &args(SHORT), dir))
        .and_then(|short| Ok((short, instructions(&exe, &args(LONG), dir)?)));
    match counted {
        Ok((short, long)) => {
            let per_cycle = long.saturating_sub(short) as f64 / (LONG - SHORT) as f64;
            let file = callgrind_file(dir, &args(LONG)).display().to_string();
            result.insert("instructions_per_cycle".into(), per_cycle.into());
            result.insert("callgrind_file".into(), file.into());
        }
        Err(reason) => {
            result.insert("instructions_na".into(), reason.into());
        }
    }
    Ok(result)
}

/// Where the callgrind run of `args` writes its profile.
fn callgrind_file(dir: &Path, args: &CountArgs) -> PathBuf {
    dir.join(format!("{}-{}.callgrind", args.lib.name(), args.cycles))
}

/// The instructions a child of `args` executed, all threads, start-up included.
fn instructions(exe: &Path, args: &CountArgs, dir: &Path) -> Result<u64, String> {
    let file = callgrind_file(dir, args);
    let mut valgrind = Command::new("valgrind");
    valgrind
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", file.display()))
        .arg(exe);
    run_child(valgrind, args)?;
    let profile = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    profile
        .lines()
        .find_map(|line| line.strip_prefix("summary:"))
        .and_then(|total| total.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("{}: no `summary:` line", file.display()))
}

/// Runs the child `command` with `args` appended: its context switches (voluntary,
/// involuntary) over the counted cycles.
fn run_child(mut command: Command, args: &CountArgs) -> Result<(u64, u64), String> {
    let program = command.get_program().to_string_lossy().into_owned();
    let output = command
        .args(args.to_args())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let counted = stdout
        .lines()
        .find_map(|line| line.strip_prefix("counted "));
    let parsed = counted.and_then(|rest| {
        let numbers: Vec<u64> = rest
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect();
        (numbers.len() == 2).then(|| (numbers[0], numbers[1]))
    });
    parsed.ok_or_else(|| {
        format!(
            "the count child ({program}, {}) failed ({}): {}{}",
            args.lib.name(),
            output.status,
            stdout.trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        )
    })
}

/// The child's side: connect, warm up, then run `args.cycles` cycles on fresh keys, printing
/// `counted <voluntary> <involuntary>`: its threads' context switches over those cycles.
pub(crate) fn child(args: CountArgs) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    runtime.block_on(async {
        let client = Client::connect(args.lib, &args.url)?;
        let tag = format!("counts:{}", std::process::id());
        client.warm_up(&tag).await?;
        let before = context_switches();
        for i in 0..args.cycles {
            let held = client.acquire(&format!("{tag}:{i}")).await?;
            client.release(held).await?;
        }
        let after = context_switches();
        println!(
            "counted {} {}",
            after.0.saturating_sub(before.0),
            after.1.saturating_sub(before.1)
        );
        Ok(())
    })
}

/// This process's context switches so far (voluntary: it slept and was woken; involuntary: it
/// was preempted), summed over its threads (`/proc/self/task/*/status`); zeros without `/proc`.
fn context_switches() -> (u64, u64) {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return (0, 0);
    };
    let mut total = (0, 0);
    for task in tasks.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        for line in status.lines() {
            let number = |rest: &str| rest.trim().parse::<u64>().unwrap_or(0);
            if let Some(rest) = line.strip_prefix("voluntary_ctxt_switches:") {
                total.0 += number(rest);
            } else if let Some(rest) = line.strip_prefix("nonvoluntary_ctxt_switches:") {
                total.1 += number(rest);
            }
        }
    }
    total
}
