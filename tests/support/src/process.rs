//! Supervising one child process: capturing its output, knowing whether it
//! has exited, and signalling it by PID without ever hitting a stranger.
//!
//! The PID-reuse hazard is the reason for the shape of this module. A PID
//! only stays ours until the zombie is reaped, so the reaper thread first
//! blocks in `waitid(WNOWAIT)` (which observes the exit without reaping), then
//! reaps while holding the same lock under which [`Child::signal`] checks
//! liveness. A signal is therefore only ever sent to our live child or to its
//! zombie.

use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// A spawned process whose stdout and stderr are collected into one log.
#[derive(Debug)]
pub(crate) struct Child {
    pid: u32,
    state: Mutex<State>,
    /// Signalled on every new output line, on end of output and on exit.
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    output: String,
    /// How many of stdout/stderr are still open.
    open_streams: u8,
    exit: Option<ExitStatus>,
}

/// How [`Child::wait_for_output`] ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    Found,
    Exited(ExitStatus),
    TimedOut,
}

impl Child {
    /// Starts `command` with stdout and stderr captured.
    pub(crate) fn spawn(mut command: Command) -> io::Result<Arc<Child>> {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut process = spawn_bound_to_us(command)?;
        let child = Arc::new(Child {
            pid: process.id(),
            state: Mutex::new(State {
                open_streams: 2,
                ..State::default()
            }),
            changed: Condvar::new(),
        });
        let stdout = process.stdout.take().expect("stdout is piped");
        let stderr = process.stderr.take().expect("stderr is piped");
        child.background("out", {
            let child = Arc::clone(&child);
            move || child.collect(stdout)
        });
        child.background("err", {
            let child = Arc::clone(&child);
            move || child.collect(stderr)
        });
        child.background("reap", {
            let child = Arc::clone(&child);
            move || child.reap(process)
        });
        Ok(child)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    pub(crate) fn is_running(&self) -> bool {
        self.lock().exit.is_none()
    }

    /// Sends `signal`; false (and nothing sent) if the process has exited.
    pub(crate) fn signal(&self, signal: libc::c_int) -> bool {
        let state = self.lock();
        if state.exit.is_some() {
            return false;
        }
        let pid = libc::pid_t::try_from(self.pid).expect("PIDs fit in pid_t");
        // SAFETY: kill(2) has no memory-safety preconditions. The PID cannot
        // have been recycled: it is reaped only under the lock we hold.
        unsafe { libc::kill(pid, signal) == 0 }
    }

    /// Waits up to `timeout` for the process to exit, and then (within the same `timeout`) for
    /// its output pipes to drain, so that what it wrote last — the line that explains the exit —
    /// is in [`output`](Self::output) when this returns. (A grandchild that inherited the pipes
    /// can keep them open; then the wait ends at the timeout, with the exit status known.)
    pub(crate) fn wait_exit(&self, timeout: Duration) -> Option<ExitStatus> {
        let (state, _) = self
            .changed
            .wait_timeout_while(self.lock(), timeout, |s| {
                s.exit.is_none() || s.open_streams > 0
            })
            .unwrap_or_else(PoisonError::into_inner);
        state.exit
    }

    /// Everything the process has written to stdout and stderr so far.
    pub(crate) fn output(&self) -> String {
        self.lock().output.clone()
    }

    /// How many bytes of output there are so far: a mark for
    /// [`wait_for_output_after`](Self::wait_for_output_after).
    pub(crate) fn output_len(&self) -> usize {
        self.lock().output.len()
    }

    /// Waits until the output contains `needle`, the process has exited, or
    /// `deadline` passes.
    pub(crate) fn wait_for_output(&self, needle: &str, deadline: Instant) -> Outcome {
        self.wait_for_output_after(needle, 0, deadline)
    }

    /// Like [`wait_for_output`](Self::wait_for_output), but only output after
    /// the first `mark` bytes (an earlier [`output_len`](Self::output_len))
    /// counts, for a line that the process may log more than once.
    pub(crate) fn wait_for_output_after(
        &self,
        needle: &str,
        mark: usize,
        deadline: Instant,
    ) -> Outcome {
        let mut state = self.lock();
        loop {
            // Output is only ever appended, so a mark stays a char boundary.
            if state.output[mark..].contains(needle) {
                return Outcome::Found;
            }
            // After an exit, wait for the pipes to drain too: the line that
            // explains the exit is usually still in flight.
            if let (Some(status), 0) = (state.exit, state.open_streams) {
                return Outcome::Exited(status);
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return match state.exit {
                    Some(status) => Outcome::Exited(status),
                    None => Outcome::TimedOut,
                };
            };
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not make every later server call panic too.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn background(&self, job: &str, work: impl FnOnce() + Send + 'static) {
        thread::Builder::new()
            .name(format!("child-{}-{job}", self.pid))
            .spawn(work)
            .unwrap_or_else(|e| panic!("cannot start a thread to watch PID {}: {e}", self.pid));
    }

    fn collect(&self, stream: impl Read) {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        // Ends on EOF, i.e. when the process (and any fork of it) is gone.
        while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
            let mut state = self.lock();
            state.output.push_str(&String::from_utf8_lossy(&line));
            self.changed.notify_all();
            drop(state);
            line.clear();
        }
        self.lock().open_streams -= 1;
        self.changed.notify_all();
    }

    fn reap(&self, mut process: std::process::Child) {
        wait_for_exit_without_reaping(self.pid);
        let mut state = self.lock();
        // ECHILD would mean someone else reaped our child; there is no status
        // left to report then, and "exited" is all that matters.
        let status = process.wait().unwrap_or_else(|_| ExitStatus::from_raw(0));
        state.exit = Some(status);
        self.changed.notify_all();
    }
}

/// Blocks until `pid` has exited, leaving it a zombie so its PID stays ours.
fn wait_for_exit_without_reaping(pid: u32) {
    let id = libc::id_t::from(pid);
    loop {
        // SAFETY: siginfo_t is plain data, and waitid only writes into the
        // struct we pass.
        let rc = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PID, id, &mut info, libc::WEXITED | libc::WNOWAIT)
        };
        if rc == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
    }
}

type SpawnJob = (Command, mpsc::Sender<io::Result<std::process::Child>>);

/// Spawns `command` so that the kernel kills it when this process dies.
///
/// Servers must not outlive the test binary, even when no destructor runs
/// (a `static` server, `process::exit`, an abort, a CI timeout). Linux offers
/// `PR_SET_PDEATHSIG`, but it fires when the *thread* that forked exits, and
/// test threads end as soon as their test does. So every fork happens on one
/// spawner thread that lives as long as the process.
fn spawn_bound_to_us(mut command: Command) -> io::Result<std::process::Child> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnJob>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, inbox) = mpsc::channel::<SpawnJob>();
        thread::Builder::new()
            .name("child-spawner".into())
            .spawn(move || {
                for (mut command, reply) in inbox {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("cannot start the process spawner thread");
        jobs
    });
    die_with_parent(&mut command);
    let (reply, answer) = mpsc::channel();
    spawner
        .send((command, reply))
        .map_err(|_| io::Error::other("the process spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the process spawner thread is gone"))?
}

#[cfg(target_os = "linux")]
fn die_with_parent(command: &mut Command) {
    let parent = libc::pid_t::try_from(std::process::id()).expect("PIDs fit in pid_t");
    // SAFETY: the hook runs between fork and exec and only makes
    // async-signal-safe system calls; it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before the prctl took effect.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_command: &mut Command) {}
