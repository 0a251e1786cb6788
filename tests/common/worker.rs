//! Worker processes for multi-process tests: the test binary runs itself again, filtered to one
//! `#[test]` that acts as the worker when `DISTLOCK_WORKER_ROLE` is set.
//!
//! Workers talk over stdin/stdout lines: a worker prints `@@<event> <data>`, the parent waits for
//! the event (a channel fed by a reader thread, bounded by a deadline — no sleeps).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

pub const ROLE_ENV: &str = "DISTLOCK_WORKER_ROLE";

/// The role this process plays, when it was started as a worker.
pub fn role() -> Option<String> {
    std::env::var(ROLE_ENV).ok()
}

/// The runtime a worker (or a synchronous parent test) runs its async part on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Prints an event for the parent.
pub fn report(event: &str, data: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "@@{event} {data}").unwrap();
    out.flush().unwrap();
}

/// Tells the parent this worker is ready, then waits — off the runtime's threads — for the
/// parent's `go`, so that every worker starts at once.
pub async fn ready_then_go() {
    report("ready", "");
    assert_eq!(order().await, "go", "the parent's start line");
}

/// Waits — off the runtime's threads — for the parent's next line.
pub async fn order() -> String {
    tokio::task::spawn_blocking(read_line).await.unwrap()
}

/// Waits for the parent's `go` (it stops and continues this worker meanwhile), then reports
/// what the locked call's checkpoint says: `held`, or `lost <reason>`.
pub async fn checkpoint_on_go() {
    assert_eq!(order().await, "go");
    let check = match distlock::checkpoint() {
        Ok(()) => "held".to_owned(),
        Err(err) => format!("lost {:?}", err.lost_reason()),
    };
    report("checkpoint", check);
}

/// Blocks until the parent sends a line.
pub fn read_line() -> String {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    line.trim().to_owned()
}

pub struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    events: Receiver<String>,
}

impl Worker {
    /// Runs `test` of the current test binary as a worker in `role`, with extra environment.
    pub fn spawn(test: &str, role: &str, env: &[(&str, String)]) -> Worker {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE_ENV, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("spawn worker");
        let stdout = child.stdout.take().unwrap();
        let (sender, events) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // libtest prints `test worker_entry ... ` before the first event, on the same line.
                if let Some((_, event)) = line.split_once("@@") {
                    if sender.send(event.to_owned()).is_err() {
                        return;
                    }
                }
            }
        });
        Worker {
            stdin: child.stdin.take(),
            child,
            events,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits for the next event named `event` and returns its data.
    pub fn expect(&self, event: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(line) => {
                    let (name, data) = line.split_once(' ').unwrap_or((&line, ""));
                    if name == event {
                        return data.to_owned();
                    }
                }
                Err(err) => panic!(
                    "worker {} sent no `{event}` within {within:?}: {err}",
                    self.pid()
                ),
            }
        }
    }

    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    pub fn signal(&self, signal: libc::c_int) {
        // The child is ours and not yet reaped (we reap only in `wait`), so its PID cannot have
        // been reused by another process.
        let rc = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(rc, 0, "kill({}, {signal}) failed", self.pid());
    }

    pub fn wait(&mut self) -> ExitStatus {
        self.child.wait().unwrap()
    }
}

/// Waits until every worker reported `ready` (see [`ready_then_go`]), then sends each its `go`:
/// they start together. Returns when they were told.
pub fn start_together(workers: &mut [Worker]) -> Instant {
    for worker in workers.iter() {
        worker.expect("ready", Duration::from_secs(30));
    }
    let started = Instant::now();
    for worker in workers.iter_mut() {
        worker.send("go");
    }
    started
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The paused-holder worker: takes the lock `held` on `backend`, reports `acquired` with its
/// token and waits for the parent's `go` (the parent stops and continues it meanwhile); then
/// reports what its checkpoint says (`held`, or `lost <reason>`) and what `fenced` made of its
/// late write of `resource`.
pub async fn hold_then_write_late(
    backend: &distlock::Backend,
    fenced: &distlock::redis::FencedStore,
) {
    distlock::Lock::new("held")
        .on(backend)
        .run(async {
            let token = distlock::fencing_token().unwrap();
            report("acquired", token);
            checkpoint_on_go().await;
            let write = fenced
                .write("resource", token, b"late write")
                .await
                .unwrap();
            report("write", format!("{write:?}"));
        })
        .await
        .unwrap();
}

/// The other side of [`hold_then_write_late`]: takes `held` on `backend` once the stopped
/// holder's lease has run out (waiting up to 10 s), and writes `resource` through the fence at
/// `resource_url` with its token, which must be applied. Returns the guard and when it was
/// granted.
pub async fn take_over_and_write(
    backend: &distlock::Backend,
    resource_url: &str,
) -> (distlock::LockGuard, Instant) {
    let guard = distlock::Lock::new("held")
        .on(backend)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let taken_at = Instant::now();
    let fenced = distlock::redis::FencedStore::open(resource_url).unwrap();
    let written = fenced
        .write("resource", guard.fencing_token(), b"new holder")
        .await
        .unwrap();
    assert_eq!(written, distlock::redis::FencedWrite::Applied);
    (guard, taken_at)
}

/// Asserts that the lock of a holder with a watchdog lease of `lease`, stopped (SIGSTOP), was
/// taken over `taken_after` the stop no earlier than the holder's validity could last: renewed at
/// most a third of the lease before the stop, it is valid for the lease less its margin
/// (`lease / 100 + 2 ms`) from that renewal.
pub fn assert_not_taken_within_validity(taken_after: Duration, lease: Duration) {
    let least = lease * 2 / 3 - lease / 100 - Duration::from_millis(2);
    assert!(
        taken_after >= least,
        "taken over {taken_after:?} after the stop, while the holder could still believe it \
         held the lock (its validity lasts at least {least:?} past the stop)"
    );
}
