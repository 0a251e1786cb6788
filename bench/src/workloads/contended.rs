//! Workload 3: many workers on one key, a short critical section each time: critical sections
//! per second, and whether the lock is shared fairly and handed over quickly.
//!
//! Every acquisition is recorded as (worker, asked at, acquired at, release started at) on the
//! wall clock, which the worker processes of the multi-process variants share. Sorted by
//! acquisition time, consecutive records give the handoffs: the time from one holder starting its
//! release to the next holder having the lock, and whether the next holder is the same worker
//! (or in the same process) again.

use super::START_DELAY;
use crate::calibrate::Origins;
use crate::cli::WorkerArgs;
use crate::clients::{run_workers, Client, LibId};
use crate::measure::{process_cpu, quantile, spin, us, wall_ns};
use crate::server_stats::{self, Delta, Window};
use distlock_test_support::RedisServer;
use serde_json::{Map, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A worker process that has not answered by then is broken.
const CHILD_DEADLINE: Duration = Duration::from_secs(120);

/// One acquisition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acquisition {
    pub(crate) worker: usize,
    /// When the worker asked for the lock.
    pub(crate) asked: u64,
    /// When it had it.
    pub(crate) acquired: u64,
    /// When it started releasing it.
    pub(crate) releasing: u64,
    /// When its release returned (the reply came back).
    pub(crate) released: u64,
}

impl Acquisition {
    pub(crate) fn to_line(self) -> String {
        format!(
            "r {} {} {} {} {}",
            self.worker, self.asked, self.acquired, self.releasing, self.released
        )
    }

    fn from_line(line: &str) -> Option<Acquisition> {
        let mut fields = line.strip_prefix("r ")?.split(' ');
        let mut next = || fields.next()?.parse::<u64>().ok();
        Some(Acquisition {
            worker: next()? as usize,
            asked: next()?,
            acquired: next()?,
            releasing: next()?,
            released: next()?,
        })
    }
}

/// `workers` workers (numbered from `first_worker`) loop on `key` for `duration`: acquire,
/// `critical_section` of busy work, release.
pub(crate) async fn contend(
    client: &Arc<Client>,
    key: &str,
    workers: usize,
    first_worker: usize,
    duration: Duration,
    critical_section: Duration,
) -> Result<Vec<Acquisition>, String> {
    let start = Instant::now() + START_DELAY;
    let deadline = start + duration;
    let key = key.to_owned();
    let per_worker = run_workers(client, workers, move |i, client| {
        let key = key.clone();
        let worker = first_worker + i;
        async move { work(&client, &key, worker, start, deadline, critical_section).await }
    })
    .await;
    let mut all = Vec::new();
    for worker in per_worker {
        all.extend(worker?);
    }
    Ok(all)
}

/// As [`contend`], one task per client of `clients` (worker `i` on `clients[i]`), for the
/// workloads whose contenders each have a connection or session of their own, as separate
/// processes would: no client is shared. Async clients only.
pub(crate) async fn contend_apart(
    clients: &[Arc<Client>],
    key: &str,
    duration: Duration,
    critical_section: Duration,
) -> Result<Vec<Acquisition>, String> {
    if clients.iter().any(|client| client.is_blocking()) {
        return Err("contend_apart runs async clients only".into());
    }
    let start = Instant::now() + START_DELAY;
    let deadline = start + duration;
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(worker, client)| {
            let (client, key) = (client.clone(), key.to_owned());
            tokio::spawn(async move {
                work(&client, &key, worker, start, deadline, critical_section).await
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        let acquisitions = task
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        all.extend(acquisitions?);
    }
    Ok(all)
}

/// One worker's loop on `key` from `start` to `deadline`: acquire, `critical_section` of busy
/// work, release.
async fn work(
    client: &Client,
    key: &str,
    worker: usize,
    start: Instant,
    deadline: Instant,
    critical_section: Duration,
) -> Result<Vec<Acquisition>, String> {
    tokio::time::sleep_until(start.into()).await;
    let mut acquisitions = Vec::with_capacity(1 << 12);
    while Instant::now() < deadline {
        let asked = wall_ns();
        let held = client.acquire(key).await?;
        let acquired = wall_ns();
        spin(critical_section);
        let releasing = wall_ns();
        client.release(held).await?;
        acquisitions.push(Acquisition {
            worker,
            asked,
            acquired,
            releasing,
            released: wall_ns(),
        });
    }
    Ok(acquisitions)
}

/// One process, `workers` tasks.
pub(crate) async fn in_process(
    server: &RedisServer,
    client: &Arc<Client>,
    origins: &Origins,
    workers: usize,
    duration: Duration,
    critical_section: Duration,
    tag: &str,
) -> Result<Map<String, Value>, String> {
    server_stats::flush(server);
    client.warm_up(tag).await?;
    let window = Window::open(server);
    let cpu_before = process_cpu();
    let acquisitions = contend(
        client,
        &format!("busy:{tag}"),
        workers,
        0,
        duration,
        critical_section,
    )
    .await?;
    let client_cpu = process_cpu().saturating_sub(cpu_before);
    let delta = window.close(server);
    let mut result = analyze(acquisitions, workers, 1)?;
    record_lock_costs(&mut result, &delta, origins, Some(client_cpu));
    Ok(result)
}

/// `clients` clients of `lib` in this process, each with its own connections (distlock: its own
/// backend), one task each, as `clients` processes of one task would run: no client is shared,
/// so every handoff crosses between clients.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn apart(
    server: &RedisServer,
    lib: LibId,
    origins: &Origins,
    clients: usize,
    duration: Duration,
    critical_section: Duration,
    tag: &str,
) -> Result<Map<String, Value>, String> {
    server_stats::flush(server);
    let mut connected = Vec::with_capacity(clients);
    for i in 0..clients {
        let client = Arc::new(Client::connect(lib, &server.url())?);
        client.warm_up(&format!("{tag}:{i}")).await?;
        connected.push(client);
    }
    let window = Window::open(server);
    let cpu_before = process_cpu();
    let acquisitions = contend_apart(
        &connected,
        &format!("busy:{tag}"),
        duration,
        critical_section,
    )
    .await?;
    let client_cpu = process_cpu().saturating_sub(cpu_before);
    let delta = window.close(server);
    let mut result = analyze(acquisitions, clients, 1)?;
    record_lock_costs(&mut result, &delta, origins, Some(client_cpu));
    Ok(result)
}

/// `processes` processes of this binary (`--worker contended`), `per_process` tasks each.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn across_processes(
    server: &RedisServer,
    client: &Client,
    origins: &Origins,
    processes: usize,
    per_process: usize,
    duration: Duration,
    critical_section: Duration,
    tag: &str,
) -> Result<Map<String, Value>, String> {
    server_stats::flush(server);
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut children = Vec::with_capacity(processes);
    for p in 0..processes {
        let args = WorkerArgs {
            lib: client.lib,
            url: server.url(),
            key: format!("busy:{tag}"),
            tasks: per_process,
            first_worker: p * per_process,
            duration,
            critical_section,
        };
        children.push(WorkerProcess::spawn(&exe, &args)?);
    }
    // The orchestrating future runs on the thread that called `block_on`, not on a runtime
    // worker, so these blocking reads hold up no task.
    for child in &mut children {
        child.expect_line("ready")?;
    }
    let window = Window::open(server);
    for child in &mut children {
        child.send("go")?;
    }
    let mut acquisitions = Vec::new();
    for child in &mut children {
        acquisitions.extend(child.collect()?);
    }
    let delta = window.close(server);
    for child in children {
        child.wait()?;
    }
    let mut result = analyze(acquisitions, processes * per_process, processes)?;
    record_lock_costs(&mut result, &delta, origins, None);
    Ok(result)
}

/// A worker process; dropping it kills it (by its own handle) if it is still running.
struct WorkerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl WorkerProcess {
    fn spawn(exe: &std::path::Path, args: &WorkerArgs) -> Result<WorkerProcess, String> {
        let mut child = Command::new(exe)
            .args(args.to_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start a worker process: {e}"))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Ok(WorkerProcess {
            child,
            stdin: Some(stdin),
            stdout,
        })
    }

    fn line(&mut self) -> Result<String, String> {
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(0) => Err("a worker process exited early (its stderr is above)".into()),
            Ok(_) => Ok(line.trim_end().to_owned()),
            Err(e) => Err(format!("reading a worker process: {e}")),
        }
    }

    fn expect_line(&mut self, expected: &str) -> Result<(), String> {
        let started = Instant::now();
        loop {
            let line = self.line()?;
            if line == expected {
                return Ok(());
            }
            if let Some(error) = line.strip_prefix("error ") {
                return Err(format!("worker process: {error}"));
            }
            if started.elapsed() > CHILD_DEADLINE {
                return Err(format!("worker process: no `{expected}` line"));
            }
        }
    }

    fn send(&mut self, line: &str) -> Result<(), String> {
        let stdin = self.stdin.as_mut().expect("stdin is open until wait");
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("writing to a worker process: {e}"))
    }

    fn collect(&mut self) -> Result<Vec<Acquisition>, String> {
        let mut acquisitions = Vec::new();
        loop {
            let line = self.line()?;
            if line == "done" {
                return Ok(acquisitions);
            }
            if let Some(error) = line.strip_prefix("error ") {
                return Err(format!("worker process: {error}"));
            }
            acquisitions.push(
                Acquisition::from_line(&line)
                    .ok_or_else(|| format!("worker process: unexpected line {line:?}"))?,
            );
        }
    }

    fn wait(mut self) -> Result<(), String> {
        drop(self.stdin.take());
        let status = self
            .child
            .wait()
            .map_err(|e| format!("waiting for a worker process: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("a worker process exited with {status}"))
        }
    }
}

/// Throughput, fairness, handoff and wait latency of a contended run.
pub(crate) fn analyze(
    mut acquisitions: Vec<Acquisition>,
    workers: usize,
    processes: usize,
) -> Result<Map<String, Value>, String> {
    let n = acquisitions.len();
    if n < 2 {
        return Err(format!("only {n} acquisitions; nothing to analyze"));
    }
    acquisitions.sort_by_key(|a| a.acquired);
    let first_ask = acquisitions.iter().map(|a| a.asked).min().unwrap_or(0);
    let last_release = acquisitions.iter().map(|a| a.releasing).max().unwrap_or(0);
    let span = (last_release.saturating_sub(first_ask)).max(1) as f64 / 1e9;

    let mut per_worker = vec![0usize; workers];
    for a in &acquisitions {
        per_worker[a.worker] += 1;
    }
    let mean = n as f64 / workers as f64;
    let share = |count: usize, fair: f64| count as f64 / fair;
    let worker_min = per_worker
        .iter()
        .map(|&c| share(c, mean))
        .fold(f64::MAX, f64::min);
    let worker_max = per_worker
        .iter()
        .map(|&c| share(c, mean))
        .fold(0.0, f64::max);
    let per_process_workers = workers / processes;
    let process_of = |worker: usize| worker / per_process_workers;

    let mut handoffs = Vec::with_capacity(n);
    let mut cross = Vec::with_capacity(n);
    let mut cross_process = Vec::new();
    // A cross-worker handoff's timeline: the release's round trip (its reply back), then the
    // next holder's start after that reply (negative: it started before the reply came).
    let (mut release_trips, mut after_reply) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut same_worker, mut same_process, mut violations) = (0usize, 0usize, 0usize);
    for pair in acquisitions.windows(2) {
        let (before, after) = (pair[0], pair[1]);
        if after.acquired < before.releasing {
            // The next holder had the lock before the previous one let go of it.
            violations += 1;
            continue;
        }
        let handoff = after.acquired - before.releasing;
        handoffs.push(handoff);
        if after.worker == before.worker {
            same_worker += 1;
        } else {
            cross.push(handoff);
            release_trips.push(before.released.saturating_sub(before.releasing));
            after_reply.push(after.acquired as i64 - before.released as i64);
        }
        if process_of(after.worker) == process_of(before.worker) {
            same_process += 1;
        } else {
            cross_process.push(handoff);
        }
    }
    handoffs.sort_unstable();
    cross.sort_unstable();
    cross_process.sort_unstable();
    let mut waits: Vec<u64> = acquisitions
        .iter()
        .map(|a| a.acquired.saturating_sub(a.asked))
        .collect();
    waits.sort_unstable();
    let pairs = (n - 1) as f64;

    let mut result = Map::new();
    result.insert("workers".into(), workers.into());
    result.insert("processes".into(), processes.into());
    result.insert("critical_sections".into(), n.into());
    result.insert("cs_per_s".into(), (n as f64 / span).into());
    result.insert(
        "self_reacquire_pct".into(),
        (100.0 * same_worker as f64 / pairs).into(),
    );
    result.insert("worker_share_min".into(), worker_min.into());
    result.insert("worker_share_max".into(), worker_max.into());
    result.insert(
        "worker_counts".into(),
        per_worker
            .iter()
            .map(|&c| Value::from(c))
            .collect::<Vec<_>>()
            .into(),
    );
    if processes > 1 {
        record_process_shares(&mut result, &acquisitions, processes, per_process_workers);
        result.insert(
            "same_process_pct".into(),
            (100.0 * same_process as f64 / pairs).into(),
        );
        result.insert(
            "cross_process_handoff_p50_us".into(),
            us(quantile(&cross_process, 0.50)).into(),
        );
    }
    result.insert(
        "handoff_p50_us".into(),
        us(quantile(&handoffs, 0.50)).into(),
    );
    result.insert(
        "handoff_p99_us".into(),
        us(quantile(&handoffs, 0.99)).into(),
    );
    result.insert("cross_handoffs".into(), cross.len().into());
    release_trips.sort_unstable();
    after_reply.sort_unstable();
    result.insert(
        "cross_release_trip_p50_us".into(),
        us(quantile(&release_trips, 0.50)).into(),
    );
    // The median as `quantile` ranks it, on signed values.
    let rank = after_reply.len().div_ceil(2).max(1);
    let after_reply_p50 = after_reply.get(rank - 1).copied();
    result.insert(
        "cross_after_reply_p50_us".into(),
        after_reply_p50.map_or(Value::Null, |ns| (ns as f64 / 1e3).into()),
    );
    result.insert(
        "cross_handoff_p50_us".into(),
        us(quantile(&cross, 0.50)).into(),
    );
    result.insert(
        "cross_handoff_p99_us".into(),
        us(quantile(&cross, 0.99)).into(),
    );
    result.insert("wait_p50_us".into(), us(quantile(&waits, 0.50)).into());
    result.insert("wait_p99_us".into(), us(quantile(&waits, 0.99)).into());
    result.insert("wait_max_us".into(), us(quantile(&waits, 1.0)).into());
    result.insert("violations".into(), violations.into());
    Ok(result)
}

/// Sections per process: `process_counts`, and the smallest and largest as a share of the mean.
/// With few workers per process, the worker shares can look even while whole processes (their
/// connections, their wake-ups) are favoured over others; these show it.
fn record_process_shares(
    result: &mut Map<String, Value>,
    acquisitions: &[Acquisition],
    processes: usize,
    per_process_workers: usize,
) {
    let mut counts = vec![0usize; processes];
    for a in acquisitions {
        counts[a.worker / per_process_workers] += 1;
    }
    let fair = acquisitions.len() as f64 / processes as f64;
    let shares = counts.iter().map(|&c| c as f64 / fair);
    let min = shares.clone().fold(f64::MAX, f64::min);
    let max = shares.fold(0.0, f64::max);
    result.insert("process_share_min".into(), min.into());
    result.insert("process_share_max".into(), max.into());
    let counts: Vec<Value> = counts.into_iter().map(Value::from).collect();
    result.insert("process_counts".into(), counts.into());
}

fn record_lock_costs(
    result: &mut Map<String, Value>,
    delta: &Delta,
    origins: &Origins,
    client_cpu: Option<Duration>,
) {
    let locks = result["critical_sections"].as_u64().unwrap_or(1).max(1);
    delta.record_costs(result, origins, locks, "lock", client_cpu);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An acquisition whose release took 500 ns.
    fn at(worker: usize, asked: u64, acquired: u64, releasing: u64) -> Acquisition {
        Acquisition {
            worker,
            asked,
            acquired,
            releasing,
            released: releasing + 500,
        }
    }

    #[test]
    fn handoffs_shares_and_violations() {
        let acquisitions = vec![
            at(0, 0, 1_000, 2_000),
            at(0, 2_500, 3_000, 4_000),
            at(1, 0, 5_000, 6_000),
            // Acquired before worker 1 let go: a violation, not a handoff.
            at(0, 4_000, 5_500, 7_000),
        ];
        let result = analyze(acquisitions, 2, 1).unwrap();
        assert_eq!(result["critical_sections"], 4);
        assert_eq!(result["violations"], 1);
        assert_eq!(result["cross_handoffs"], 1);
        assert_eq!(result["cross_handoff_p50_us"], 1.0);
        // 4,000 -> 5,000: the release came back at 4,500, the next holder 500 ns later.
        assert_eq!(result["cross_release_trip_p50_us"], 0.5);
        assert_eq!(result["cross_after_reply_p50_us"], 0.5);
        assert_eq!(result["worker_share_max"], 1.5);
        assert_eq!(result["wait_max_us"], 5.0);
    }

    #[test]
    fn shares_and_handoffs_per_process() {
        // 3 processes x 2 workers: process 0 holds the lock twice, process 2 never.
        let acquisitions = vec![
            at(0, 0, 1_000, 2_000),
            at(1, 0, 2_500, 3_000),
            at(2, 0, 5_000, 6_000),
            at(3, 0, 8_000, 9_000),
        ];
        let result = analyze(acquisitions, 6, 3).unwrap();
        assert_eq!(result["process_counts"], serde_json::json!([2, 2, 0]));
        assert_eq!(result["process_share_min"], 0.0);
        assert_eq!(result["process_share_max"], 1.5);
        // Handoffs: 0->1 within process 0, 1->2 across processes (2 us), 2->3 within process 1.
        assert_eq!(result["cross_process_handoff_p50_us"], 2.0);
        assert!((result["same_process_pct"].as_f64().unwrap() - 200.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn lines_round_trip() {
        let a = at(3, 10, 20, 30);
        assert_eq!(Acquisition::from_line(&a.to_line()), Some(a));
    }
}
