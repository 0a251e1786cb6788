//! Real `redis-server` processes on 127.0.0.1, one free port and one temp
//! dir each, controlled by PID.

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::client::{command_at, pipeline_at};
use crate::ports::{free_cluster_port, free_port};
use crate::process::{Child, Outcome};
use crate::resp::Reply;

/// Environment variable naming the `redis-server` binary to run; without it
/// `redis-server` is looked up on `PATH`.
pub const REDIS_SERVER_ENV: &str = "DISTLOCK_REDIS_SERVER";

/// Logged (at the default `notice` level) once the server serves clients.
const READY_LINE: &str = "Ready to accept connections";
/// Logged when the port was taken between [`free_port`] and the bind.
pub(crate) const PORT_TAKEN_LINE: &str = "Address already in use";

/// Upper bound for a start (or restart) to reach [`READY_LINE`].
pub(crate) const START_DEADLINE: Duration = Duration::from_secs(10);
/// Grace period between SIGTERM and SIGKILL in [`RedisServer::stop`]. A
/// master waits for lagging replicas on shutdown, so this must not be tiny.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// Upper bound for a SIGKILLed process to be reaped; only a kernel in
/// trouble takes longer.
pub(crate) const KILL_DEADLINE: Duration = Duration::from_secs(10);
/// Upper bound for one [`RedisServer::command`] round trip.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// Fresh ports tried before giving up on a start.
pub(crate) const PORT_ATTEMPTS: usize = 5;
/// Log lines quoted in panic messages.
const TAIL_LINES: usize = 30;

/// Settings the harness owns; overriding them would break port allocation,
/// log capture, readiness detection or cleanup.
const RESERVED: &[&str] = &[
    "port",
    "bind",
    "dir",
    "logfile",
    "daemonize",
    "replicaof",
    "slaveof",
];

/// Extra configuration for [`RedisServer::start_with`].
///
/// The harness always passes `--port <free> --bind 127.0.0.1 --dir <temp dir>
/// --logfile "" --daemonize no --protected-mode no --save "" --appendonly no
/// --enable-debug-command local --repl-diskless-sync-delay 0`: no
/// persistence, so a restart starts empty; `DEBUG SLEEP` allowed for stall
/// tests; a master syncs a new replica at once instead of waiting 5 s for
/// more replicas to batch with. Options added here come after those and so
/// override the overridable ones.
///
/// With `("cluster-enabled", "yes")` the server's port is chosen with
/// [`free_cluster_port`](crate::free_cluster_port), so that its cluster bus
/// port (the port plus 10000) is free as well; a relative
/// `cluster-config-file` (the default is `nodes.conf`) lands in the server's
/// temp dir, because Redis resolves it against `dir`.
#[derive(Debug, Clone, Default)]
pub struct ServerConfig {
    args: Vec<(String, String)>,
    replica_of: Option<u16>,
    /// Run `valkey-server` instead of `redis-server`.
    valkey: bool,
}

impl ServerConfig {
    /// Runs Valkey (`valkey-server`, or the binary named by `DISTLOCK_VALKEY_SERVER`) instead of
    /// Redis, with the same options.
    pub fn valkey(mut self) -> Self {
        self.valkey = true;
        self
    }

    /// The default configuration.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `--<name> <value>`, e.g. `("maxmemory-policy", "allkeys-lru")`.
    /// A value with spaces is passed as one argument (`("save", "60 1")`).
    ///
    /// # Panics
    ///
    /// For options the harness owns (`port`, `bind`, `dir`, `logfile`,
    /// `daemonize`, `replicaof`/`slaveof`; use [`ServerConfig::replica_of`])
    /// and for a `loglevel` that would hide the readiness line.
    pub fn arg(mut self, name: &str, value: &str) -> Self {
        let name = name.trim_start_matches('-');
        assert!(
            !RESERVED.contains(&name.to_ascii_lowercase().as_str()),
            "ServerConfig::arg: `{name}` is set by the harness and cannot be overridden"
        );
        assert!(
            !(name.eq_ignore_ascii_case("loglevel")
                && matches!(value.to_ascii_lowercase().as_str(), "warning" | "nothing")),
            "ServerConfig::arg: loglevel `{value}` hides \"{READY_LINE}\", which the harness waits for"
        );
        self.args.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Makes the server a replica of the master on `127.0.0.1:<port>`.
    ///
    /// The replica is "ready" once it accepts connections, usually before the
    /// initial sync; wait for [`RedisServer::wait_for_replica_sync`] (or use
    /// `WAIT` on the master) before reading replicated data.
    pub fn replica_of(mut self, port: u16) -> Self {
        self.replica_of = Some(port);
        self
    }

    /// The TLS port (`tls-port`), if the configuration sets one.
    fn tls_port(&self) -> Option<u16> {
        self.args
            .iter()
            .rev()
            .find(|(name, _)| name.eq_ignore_ascii_case("tls-port"))
            .and_then(|(_, value)| value.parse().ok())
            .filter(|&port| port != 0)
    }

    /// Whether the server will be a Redis Cluster node listening on the
    /// default bus port (its port plus 10000).
    fn needs_bus_port(&self) -> bool {
        let set = |option: &str| {
            self.args
                .iter()
                .rev()
                .find(|(name, _)| name.eq_ignore_ascii_case(option))
                .map(|(_, value)| value.as_str())
        };
        set("cluster-enabled").is_some_and(|v| v.eq_ignore_ascii_case("yes"))
            && set("cluster-port").is_none_or(|v| v == "0")
    }

    /// A free port for this server, see [`ServerConfig::needs_bus_port`].
    fn free_port(&self) -> u16 {
        if self.needs_bus_port() {
            free_cluster_port()
        } else {
            free_port()
        }
    }

    fn command(&self, port: u16, dir: &Path) -> Command {
        let binary = if self.valkey {
            std::env::var_os(VALKEY_SERVER_ENV).unwrap_or_else(|| OsString::from("valkey-server"))
        } else {
            redis_server_binary()
        };
        let mut command = Command::new(binary);
        command
            .args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(dir)
            .args(["--logfile", ""])
            .args(["--daemonize", "no"])
            .args(["--protected-mode", "no"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--enable-debug-command", "local"])
            .args(["--repl-diskless-sync-delay", "0"]);
        if let Some(master) = self.replica_of {
            command.args(["--replicaof", "127.0.0.1", &master.to_string()]);
        }
        for (name, value) in &self.args {
            command.arg(format!("--{name}")).arg(value);
        }
        command
    }
}

/// A `redis-server` child process owned by the test.
///
/// Dropping it SIGKILLs the process by PID, reaps it and removes its temp dir.
/// Should the test process die without running destructors, the kernel kills
/// the server too (Linux `PR_SET_PDEATHSIG`).
pub struct RedisServer {
    config: ServerConfig,
    port: u16,
    dir: PathBuf,
    /// The current (or last) process; replaced by [`RedisServer::restart`].
    child: Arc<Child>,
    /// Output of the processes before the current one.
    earlier_output: String,
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("pid", &self.child.pid())
            .field("running", &self.child.is_running())
            .field("dir", &self.dir)
            .finish()
    }
}

impl RedisServer {
    /// Starts a standalone master with the default configuration and waits
    /// until it accepts connections.
    ///
    /// # Panics
    ///
    /// If `redis-server` cannot be run or does not become ready within 10 s;
    /// the message quotes the end of its log.
    pub fn start() -> RedisServer {
        Self::start_with(ServerConfig::new())
    }

    /// Starts a server with extra configuration; see [`RedisServer::start`].
    pub fn start_with(config: ServerConfig) -> RedisServer {
        let dir = make_temp_dir();
        let mut last_output = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = config.free_port();
            match launch(&config, port, &dir) {
                Ok(child) => {
                    return RedisServer {
                        config,
                        port,
                        dir,
                        child,
                        earlier_output: String::new(),
                    }
                }
                // Someone else bound the port after free_port released it.
                Err(Failure::PortTaken(output)) => last_output = output,
                Err(Failure::Other(message)) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    panic!("{message}");
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        panic!(
            "redis-server: every one of {PORT_ATTEMPTS} free ports was taken before it could bind; last log:\n{}",
            tail(&last_output)
        );
    }

    /// Starts `n` independent masters, in parallel since each start mostly
    /// waits on the child.
    pub fn start_many(n: usize) -> Vec<RedisServer> {
        Self::start_many_with(n, &ServerConfig::new())
    }

    /// Starts `n` servers with the same configuration, in parallel.
    pub fn start_many_with(n: usize, config: &ServerConfig) -> Vec<RedisServer> {
        Self::start_each(vec![config.clone(); n])
    }

    /// Starts a server for each configuration, in parallel.
    pub fn start_each(configs: Vec<ServerConfig>) -> Vec<RedisServer> {
        thread::scope(|scope| {
            let starts: Vec<_> = configs
                .into_iter()
                .map(|config| scope.spawn(|| RedisServer::start_with(config)))
                .collect();
            starts
                .into_iter()
                .map(|start| {
                    start
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        })
    }

    /// The TLS port, if the server has one (it stays the same across [`RedisServer::restart`]).
    pub fn tls_port(&self) -> Option<u16> {
        self.config.tls_port()
    }

    /// The port others know this server by: its TLS port if it has one (replicas, sentinels and
    /// cluster nodes then reach it over TLS), else [`RedisServer::port`].
    pub fn announced_port(&self) -> u16 {
        self.tls_port().unwrap_or(self.port)
    }

    /// The plain TCP port, on which the harness itself talks to the server; it stays the same
    /// across [`RedisServer::restart`].
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// PID of the current process (a restart changes it).
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// The server's working directory, private to this server.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the process is alive (a paused server is alive).
    pub fn is_running(&self) -> bool {
        self.child.is_running()
    }

    /// Graceful shutdown: SIGTERM, then wait for the exit; SIGKILL if it has
    /// not exited within 5 s. Does nothing if the server is not running.
    pub fn stop(&mut self) {
        if !self.child.signal(libc::SIGTERM) {
            return;
        }
        // A paused server would hold the SIGTERM pending forever.
        self.child.signal(libc::SIGCONT);
        if self.child.wait_exit(STOP_GRACE).is_none() {
            self.kill();
        }
    }

    /// Crash-like stop: SIGKILL, then wait for the exit. Does nothing if the
    /// server is not running.
    ///
    /// # Panics
    ///
    /// If the process is still not gone 10 s after SIGKILL.
    pub fn kill(&mut self) {
        if self.child.signal(libc::SIGKILL) && self.child.wait_exit(KILL_DEADLINE).is_none() {
            panic!(
                "redis-server PID {} survived SIGKILL for {KILL_DEADLINE:?}",
                self.pid()
            );
        }
    }

    /// Freezes the process (SIGSTOP): connections stay open and connects still
    /// succeed (the kernel completes the handshake), but nothing is answered,
    /// like a server stuck in a long GC-style stall.
    ///
    /// # Panics
    ///
    /// If the server is not running.
    pub fn pause(&self) {
        self.signal_running(libc::SIGSTOP, "pause");
    }

    /// Continues a paused process (SIGCONT).
    ///
    /// # Panics
    ///
    /// If the server is not running.
    pub fn resume(&self) {
        self.signal_running(libc::SIGCONT, "resume");
    }

    /// Stops the server (gracefully, if it is running) and starts it again on
    /// the same port and dir, waiting until it accepts connections. Data does
    /// not survive unless persistence was configured.
    ///
    /// # Panics
    ///
    /// If the new process does not become ready, e.g. because another process
    /// took the port in the meantime.
    pub fn restart(&mut self) {
        self.stop();
        self.earlier_output.push_str(&self.child.output());
        match launch(&self.config, self.port, &self.dir) {
            Ok(child) => self.child = child,
            Err(Failure::PortTaken(output)) => panic!(
                "redis-server restart: port {} was taken by another process; log:\n{}",
                self.port,
                tail(&output)
            ),
            Err(Failure::Other(message)) => panic!("redis-server restart: {message}"),
        }
    }

    /// Runs one command over a fresh connection and returns the reply (an
    /// error reply is a [`Reply::Error`], not a panic).
    ///
    /// # Panics
    ///
    /// On I/O failure, including no reply within 10 s; see
    /// [`RedisServer::try_command`] for a fallible version.
    pub fn command(&self, args: &[&str]) -> Reply {
        self.try_command(args, COMMAND_TIMEOUT).unwrap_or_else(|e| {
            panic!(
                "redis-server on port {}: {args:?} failed: {e}; log:\n{}",
                self.port,
                tail(&self.log())
            )
        })
    }

    /// Subscribers of `channel` (`PUBSUB NUMSUB`).
    pub fn subscribers(&self, channel: &str) -> i64 {
        self.channel_subscribers("NUMSUB", channel)
    }

    /// Sharded subscribers of `channel` (`PUBSUB SHARDNUMSUB`, Redis Cluster).
    pub fn shard_subscribers(&self, channel: &str) -> i64 {
        self.channel_subscribers("SHARDNUMSUB", channel)
    }

    fn channel_subscribers(&self, count: &str, channel: &str) -> i64 {
        match self.command(&["PUBSUB", count, channel]) {
            Reply::Array(Some(items)) if items.len() == 2 => items[1]
                .as_int()
                .unwrap_or_else(|| panic!("PUBSUB {count}: {items:?}")),
            other => panic!("PUBSUB {count}: {other:?}"),
        }
    }

    /// Like [`RedisServer::command`] with a caller-chosen bound on the whole
    /// exchange, returning I/O errors instead of panicking, e.g. to observe
    /// that a paused server does not answer.
    ///
    /// # Errors
    ///
    /// As for [`command_at`](crate::command_at): `ConnectionRefused` when the
    /// server is down, `WouldBlock`/`TimedOut` when it does not answer in time.
    pub fn try_command(&self, args: &[&str], timeout: Duration) -> io::Result<Reply> {
        command_at(self.addr(), args, timeout)
    }

    /// Runs several commands pipelined on one fresh connection and returns
    /// their replies, for commands that depend on their connection's earlier
    /// ones (`WAIT` after a write, `MULTI` … `EXEC`).
    ///
    /// # Panics
    ///
    /// On I/O failure, including no replies within 10 s.
    pub fn pipeline(&self, commands: &[&[&str]]) -> Vec<Reply> {
        pipeline_at(self.addr(), commands, COMMAND_TIMEOUT).unwrap_or_else(|e| {
            panic!(
                "redis-server on port {}: pipeline {commands:?} failed: {e}; log:\n{}",
                self.port,
                tail(&self.log())
            )
        })
    }

    /// Everything the server has logged so far, across restarts.
    pub fn log(&self) -> String {
        self.earlier_output.clone() + &self.child.output()
    }

    /// Waits until the current process has logged a line containing `needle`
    /// (lines from before the call count).
    ///
    /// # Panics
    ///
    /// If it does not within 10 s, or the process exits first.
    pub fn wait_for_log(&self, needle: &str) {
        match self.child.wait_for_output(needle, Instant::now() + START_DEADLINE) {
            Outcome::Found => {}
            Outcome::Exited(status) => panic!(
                "redis-server on port {} exited ({status}) before logging {needle:?}; log:\n{}",
                self.port,
                tail(&self.child.output())
            ),
            Outcome::TimedOut => panic!(
                "redis-server on port {} did not log {needle:?} within {START_DEADLINE:?}; log:\n{}",
                self.port,
                tail(&self.child.output())
            ),
        }
    }

    /// Waits until this replica has completed its initial sync with the
    /// master, so that data written to the master before now is readable here.
    pub fn wait_for_replica_sync(&self) {
        // Redis logs "MASTER <-> REPLICA sync: …", Valkey "PRIMARY <-> REPLICA sync: …".
        self.wait_for_log("<-> REPLICA sync: Finished with success");
    }

    /// How much the current process has logged so far: a mark for
    /// [`RedisServer::await_log`], for a line that may be logged more than
    /// once. A restart starts a new process, and marks with it.
    pub(crate) fn log_mark(&self) -> usize {
        self.child.output_len()
    }

    /// Waits until the current process has logged `needle` after its first
    /// `mark` bytes of output, and returns the mark just past it. `Err` holds
    /// a panic message quoting the log's tail, if the process exits first or
    /// `deadline` passes.
    pub(crate) fn await_log(
        &self,
        needle: &str,
        mark: usize,
        deadline: Instant,
    ) -> Result<usize, String> {
        match self.child.wait_for_output_after(needle, mark, deadline) {
            Outcome::Found => {
                let output = self.child.output();
                let at = output[mark..]
                    .find(needle)
                    .expect("output only grows, so what was found stays");
                Ok(mark + at + needle.len())
            }
            Outcome::Exited(status) => Err(format!(
                "redis-server on port {} exited ({status}) before logging {needle:?}; log:\n{}",
                self.port,
                tail(&self.child.output())
            )),
            Outcome::TimedOut => Err(format!(
                "redis-server on port {} did not log {needle:?} in time; log:\n{}",
                self.port,
                tail(&self.child.output())
            )),
        }
    }

    /// On a primary: waits until `replicas` replicas acknowledge its writes
    /// (`WAIT`, event-driven on the server). A replica that logged the end
    /// of its initial sync is not streaming yet: the primary starts sending it
    /// commands only at its first `REPLCONF ACK`, which replicas send once a
    /// second, so until then `WAIT` counts it out. Writes and deletes one key,
    /// `distlock-harness:replicas`.
    ///
    /// # Panics
    ///
    /// If fewer replicas acknowledge within 10 s.
    pub fn wait_for_replicas(&self, replicas: usize) {
        self.wait_for_replicas_using("distlock-harness:replicas", replicas);
    }

    /// [`RedisServer::wait_for_replicas`] writing `key`, which a cluster node
    /// must own (a redirected write would leave nothing to wait for).
    pub(crate) fn wait_for_replicas_using(&self, key: &str, replicas: usize) {
        let wanted = replicas.to_string();
        let timeout_ms = COMMAND_TIMEOUT.as_millis().to_string();
        let replies = self.pipeline(&[
            &["SET", key, "1"],
            &["WAIT", &wanted, &timeout_ms],
            &["DEL", key],
        ]);
        assert_eq!(
            replies[0],
            Reply::Simple("OK".into()),
            "redis-server on port {}: SET {key} before WAIT",
            self.port
        );
        assert!(
            matches!(replies[1], Reply::Int(n) if n >= replicas as i64),
            "redis-server on port {}: {replicas} replicas did not acknowledge within \
             {COMMAND_TIMEOUT:?} (WAIT answered {:?}); log:\n{}",
            self.port,
            replies[1],
            tail(&self.log())
        );
    }

    fn signal_running(&self, signal: libc::c_int, what: &str) {
        assert!(
            self.child.signal(signal),
            "{what}: redis-server on port {} is not running",
            self.port
        );
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // Never panic here: a drop during unwinding would abort the test binary.
        if self.child.signal(libc::SIGKILL) && self.child.wait_exit(KILL_DEADLINE).is_none() {
            eprintln!(
                "redis-server PID {} survived SIGKILL for {KILL_DEADLINE:?}",
                self.pid()
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Why [`launch`] (or a sentinel's launch) produced no ready process.
pub(crate) enum Failure {
    /// The port was taken; the caller may try another one. Holds the log.
    PortTaken(String),
    /// Anything else, as a complete panic message.
    Other(String),
}

/// Environment variable naming the `valkey-server` binary ([`ServerConfig::valkey`]); without it
/// `valkey-server` is looked up on `PATH`.
pub const VALKEY_SERVER_ENV: &str = "DISTLOCK_VALKEY_SERVER";

/// The `redis-server` binary: [`REDIS_SERVER_ENV`] if set, else from `PATH`.
pub(crate) fn redis_server_binary() -> OsString {
    std::env::var_os(REDIS_SERVER_ENV).unwrap_or_else(|| OsString::from("redis-server"))
}

/// Runs one `redis-server` process and waits until it is ready.
fn launch(config: &ServerConfig, port: u16, dir: &Path) -> Result<Arc<Child>, Failure> {
    let child = Child::spawn(config.command(port, dir)).map_err(|e| {
        Failure::Other(format!(
            "cannot run the server ({e}); install it (`apt-get install redis-server`; for \
             Valkey, scripts/test.sh fetches `valkey-server`) \
             or point {REDIS_SERVER_ENV} at the binary"
        ))
    })?;
    match child.wait_for_output(READY_LINE, Instant::now() + START_DEADLINE) {
        Outcome::Found => Ok(child),
        Outcome::Exited(_) if child.output().contains(PORT_TAKEN_LINE) => {
            Err(Failure::PortTaken(child.output()))
        }
        Outcome::Exited(status) => Err(Failure::Other(format!(
            "redis-server on port {port} exited ({status}) before it was ready; log:\n{}",
            tail(&child.output())
        ))),
        Outcome::TimedOut => {
            child.signal(libc::SIGKILL);
            child.wait_exit(KILL_DEADLINE);
            Err(Failure::Other(format!(
                "redis-server on port {port} was not ready within {START_DEADLINE:?}; log:\n{}",
                tail(&child.output())
            )))
        }
    }
}

/// Creates a fresh, empty directory under the system temp dir.
pub(crate) fn make_temp_dir() -> PathBuf {
    make_temp_dir_in(&std::env::temp_dir())
}

/// A new, empty directory of this process's under `root`.
pub(crate) fn make_temp_dir_in(root: &Path) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = root.join(format!("distlock-redis-{}-{n}", std::process::id()));
        // create_dir (not create_dir_all) fails on an existing dir, e.g. one
        // left behind by an earlier process that had the same PID.
        match std::fs::create_dir(&dir) {
            Ok(()) => return dir,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("cannot create a temp dir under {}: {e}", root.display()),
        }
    }
}

/// The last lines of a log, for panic messages.
pub(crate) fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_port_is_reported_as_such() {
        let squatter = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = squatter.local_addr().unwrap().port();
        let dir = make_temp_dir();
        let result = launch(&ServerConfig::new(), port, &dir);
        std::fs::remove_dir_all(&dir).unwrap();
        match result {
            Err(Failure::PortTaken(log)) => assert!(log.contains(PORT_TAKEN_LINE), "{log}"),
            Err(Failure::Other(message)) => panic!("wrong failure: {message}"),
            Ok(_) => panic!("redis-server bound a port that was in use"),
        }
    }

    #[test]
    fn cluster_nodes_get_a_port_with_a_free_bus_port() {
        let cluster = ServerConfig::new().arg("cluster-enabled", "yes");
        assert!(cluster.needs_bus_port());
        assert!(cluster.clone().arg("cluster-port", "0").needs_bus_port());
        // A bus port of its own, or no cluster at all (the last setting wins).
        assert!(!cluster
            .clone()
            .arg("cluster-port", "20000")
            .needs_bus_port());
        assert!(!cluster.arg("cluster-enabled", "no").needs_bus_port());
        assert!(!ServerConfig::new().needs_bus_port());
    }

    #[test]
    fn reserved_options_are_refused() {
        let result = std::panic::catch_unwind(|| ServerConfig::new().arg("--port", "1"));
        assert!(result.is_err());
    }
}
