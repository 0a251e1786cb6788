//! `--pin`: where the benchmark's client and its servers run, so that a loopback round trip costs
//! the same in every phase.
//!
//! On a VM a round trip between two threads costs what waking the other thread costs. A thread
//! woken on the CPU that woke it runs as soon as the waker sleeps; one woken on another CPU, which
//! has gone idle meanwhile, costs that CPU's wake-up — tens of microseconds on a small
//! Firecracker VM, both ways. Left alone, the kernel's scheduler picks one of the two placements
//! for a client and its server at the start of a phase and mostly keeps it, so that two libraries
//! measured a minute apart can see round trips 7 × apart. Pinning takes that choice away:
//!
//! - `split` keeps the servers on the first CPU and the client (this process, its worker
//!   processes and `redis-benchmark`) on the second: every message crosses between CPUs, as it
//!   crosses a network between machines — the slow floor.
//! - `shared` puts everything on the first CPU: no message wakes another CPU — the fastest floor
//!   the machine has. Client and servers then share that one CPU's time.

use std::process::Command;

/// The placement of a run (`--pin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pin {
    /// Wherever the scheduler puts them (the default).
    None,
    /// Servers on CPU 0, the client on CPU 1.
    Split,
    /// Servers and client on CPU 0.
    Shared,
}

impl Pin {
    pub(crate) fn from_name(name: &str) -> Option<Pin> {
        match name {
            "none" => Some(Pin::None),
            "split" => Some(Pin::Split),
            "shared" => Some(Pin::Shared),
            _ => None,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Pin::None => "none",
            Pin::Split => "split",
            Pin::Shared => "shared",
        }
    }

    /// What the placement is, for the table's header.
    pub(crate) fn description(self) -> &'static str {
        match self {
            Pin::None => {
                "the scheduler's (on a VM a round trip can cost 7 x more in one phase than in the \
                 next; --pin split or --pin shared fixes it)"
            }
            Pin::Split => "split: servers on CPU 0, client on CPU 1 (every message crosses CPUs)",
            Pin::Shared => "shared: servers and client on CPU 0 (no cross-CPU wake-ups)",
        }
    }

    /// The CPUs (server's, client's), if pinned.
    fn cpus(self) -> Option<(u32, u32)> {
        match self {
            Pin::None => None,
            Pin::Split => Some((0, 1)),
            Pin::Shared => Some((0, 0)),
        }
    }

    /// Pins this process — before it starts any thread, so that every thread it starts later
    /// (the runtime's workers) and every process it starts (the worker processes,
    /// `redis-benchmark`) inherits the client's CPU.
    pub(crate) fn client(self) -> Result<(), String> {
        match self.cpus() {
            None => Ok(()),
            Some((_, client)) => pin(std::process::id(), client),
        }
    }

    /// Pins a server process the run started, all its threads.
    pub(crate) fn server(self, pid: u32) -> Result<(), String> {
        match self.cpus() {
            None => Ok(()),
            Some((server, _)) => pin(pid, server),
        }
    }
}

/// The CPUs the kernel lets process `pid` run on, as `/proc` lists them ("0-1", "1"), or
/// "unknown" where there is no `/proc`.
pub(crate) fn allowed_cpus(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix("Cpus_allowed_list:")
                    .map(|list| list.trim().to_owned())
            })
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Every thread of process `pid` on CPU `cpu`, by util-linux's `taskset`.
fn pin(pid: u32, cpu: u32) -> Result<(), String> {
    let output = Command::new("taskset")
        .args(["--all-tasks", "--cpu-list", "--pid"])
        .arg(cpu.to_string())
        .arg(pid.to_string())
        .output()
        .map_err(|err| {
            format!("`--pin` runs `taskset` (util-linux), which could not be started: {err}")
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`--pin`: `taskset` could not put process {pid} on CPU {cpu} (this machine needs CPUs 0 and 1): {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}
