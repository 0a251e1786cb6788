//! A Redis Sentinel deployment on 127.0.0.1: one primary, one replica and
//! three sentinels, all real processes started by the harness and stopped by
//! PID.
//!
//! A sentinel is `redis-server <config> --sentinel`, the same binary as
//! [`RedisServer`] (so [`REDIS_SERVER_ENV`](crate::REDIS_SERVER_ENV) applies).
//! It needs a config file it can rewrite (it records what it discovers
//! there), so each sentinel gets its own temp dir holding that file.
//!
//! Sentinels log no "Ready to accept connections"; what the harness waits for
//! instead are their event lines: `+monitor master …` once running, `+slave …`
//! and `+sentinel …` as they discover the replica and each other (through
//! hello messages the sentinels publish on the monitored servers), and
//! `+switch-master …` once a failover is done.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use crate::client::command_at;
use crate::ports::free_port;
use crate::process::{Child, Outcome};
use crate::server::{
    make_temp_dir, redis_server_binary, tail, Failure, COMMAND_TIMEOUT, KILL_DEADLINE,
    PORT_ATTEMPTS, PORT_TAKEN_LINE, REDIS_SERVER_ENV, START_DEADLINE,
};
use crate::tls::TestPki;
use crate::{RedisServer, Reply, ServerConfig};

/// The name under which the sentinels monitor the primary, the last part of
/// [`SentinelGroup::sentinel_url`].
pub const MASTER_NAME: &str = "distlock-primary";

/// Sentinels in a group.
const SENTINELS: usize = 3;
/// Sentinels that must agree the primary is down before a failover; the
/// failover itself needs a majority (also 2 of 3) to elect a leader.
const QUORUM: usize = 2;
/// The sentinels' `failover-timeout`. It bounds the wait for the chosen
/// replica to report itself master (sentinels ask every second during a
/// failover), and a failed attempt (say, a split vote) is retried after twice
/// this, so small enough to keep a retried failover within a test's patience
/// and large enough that a promotion is not given up on a busy machine.
const FAILOVER_TIMEOUT: Duration = Duration::from_millis(2000);
/// How often a sentinel publishes its hello message on the monitored servers
/// (`SENTINEL DEBUG publish-period`; 2 s by default). Sentinels discover each
/// other through these, and turn a restarted old primary into a replica
/// after four of these periods.
const HELLO_PERIOD: Duration = Duration::from_millis(500);
/// How often a sentinel asks the servers for `INFO` while no failover is
/// going on (`SENTINEL DEBUG info-period`; 10 s by default). It bounds how
/// long a sentinel takes to notice a new replica or a changed role.
const INFO_PERIOD: Duration = Duration::from_millis(1000);
/// Bounds for the sentinels' `SENTINEL DEBUG ping-period`; see [`ping_period`].
const MIN_PING_PERIOD: Duration = Duration::from_millis(250);
const MAX_PING_PERIOD: Duration = Duration::from_millis(1000);
/// Upper bound for every sentinel to discover the replica and the other
/// sentinels, which normally takes about one [`HELLO_PERIOD`].
const DISCOVERY_DEADLINE: Duration = Duration::from_secs(20);
/// Upper bound from killing the primary to every sentinel switching to the
/// replica.
const FAILOVER_DEADLINE: Duration = Duration::from_secs(30);
/// Logged by a sentinel at startup, followed by its 40-hex-digit ID.
const ID_LINE: &str = "Sentinel ID is ";
/// Logged by a replica when told to become a master (`REPLICAOF NO ONE`).
const PROMOTED_LINE: &str = "MASTER MODE enabled";

/// One primary, its replicas (one unless started with
/// [`SentinelGroup::start_with_replicas`]) and three sentinels monitoring them as
/// [`MASTER_NAME`] with quorum 2, for failover tests.
///
/// The harness tracks which server is the primary: it starts as the one the
/// replica was started against, and [`SentinelGroup::kill_primary_and_wait_failover`]
/// swaps the roles. Killing, pausing or restarting servers through
/// [`SentinelGroup::primary_mut`] or [`SentinelGroup::replica_mut`] does not;
/// the sentinels may then fail over on their own, unknown to the harness.
///
/// Dropping the group SIGKILLs the sentinels and both servers by PID (the
/// sentinels first, so they do not react to the servers going away) and
/// removes all their temp dirs.
#[derive(Debug)]
pub struct SentinelGroup {
    /// Declared before `servers`, so dropped (killed) before them.
    sentinels: Vec<SentinelProcess>,
    servers: Vec<RedisServer>,
    /// Index into `servers` of the current primary.
    primary: usize,
    /// A TLS group's certificates; declared last, so removed after every process is gone.
    pki: Option<TestPki>,
}

impl SentinelGroup {
    /// Starts a primary, a replica of it (and waits for the replica's initial
    /// sync), then three sentinels monitoring the primary with quorum 2,
    /// `down-after-milliseconds` = `down_after`, `failover-timeout` 2 s and
    /// `parallel-syncs` 1. The sentinels' internal periods are shortened too
    /// (hello 0.5 s, `INFO` 1 s, ping half of `down_after` but within
    /// 0.25–1 s), which Redis only allows through `SENTINEL DEBUG`.
    ///
    /// Returns only once every sentinel has discovered the replica and both
    /// other sentinels, so that a failover can be agreed on and authorised as
    /// soon as the primary is down; that takes about one hello period.
    ///
    /// A `down_after` of 400 ms or more is best: below that, Redis 7.0
    /// sentinels may declare the just-promoted primary down right after a
    /// failover, as they reconnect to it at most once per ping period (and
    /// then promote a restarted old primary if there is one). A shorter
    /// `down_after` gains little anyway: with 500 ms, a failover takes 1–2 s.
    ///
    /// # Panics
    ///
    /// If `down_after` is under 1 ms, if a process cannot be started, or if
    /// the sentinels do not discover each other and the replica within 20 s;
    /// the message quotes the log concerned.
    pub fn start(down_after: Duration) -> SentinelGroup {
        Self::start_with_replicas(1, down_after)
    }

    /// Like [`SentinelGroup::start`], with `replicas` replicas (at least 1).
    /// With two, a failover leaves the promoted server a replica of its own
    /// (the sentinels point the other one at it before announcing the
    /// switch), as a primary that waits for one replica's acknowledgement
    /// needs.
    ///
    /// # Panics
    ///
    /// As [`SentinelGroup::start`], and for `replicas == 0`.
    pub fn start_with_replicas(replicas: usize, down_after: Duration) -> SentinelGroup {
        SentinelGroup::start_group(replicas, down_after, None)
    }

    /// Like [`SentinelGroup::start_with_replicas`], encrypted: every server and sentinel takes
    /// clients on a TLS port (the certificate of [`SentinelGroup::pki`]'s server), replicas
    /// replicate over TLS, sentinels talk to the servers and to each other over TLS, and the
    /// sentinels name the servers' TLS ports. Each process keeps a plain port on loopback for
    /// the harness's own commands, which no client is told of.
    ///
    /// # Panics
    ///
    /// As [`SentinelGroup::start`].
    pub fn start_tls(replicas: usize, down_after: Duration) -> SentinelGroup {
        SentinelGroup::start_group(replicas, down_after, Some(TestPki::generate()))
    }

    fn start_group(replicas: usize, down_after: Duration, pki: Option<TestPki>) -> SentinelGroup {
        assert!(
            down_after.as_millis() >= 1,
            "SentinelGroup::start: down_after must be at least 1 ms, not {down_after:?}"
        );
        assert!(replicas >= 1, "SentinelGroup: a failover needs a replica");
        let config = |config: ServerConfig| match &pki {
            Some(pki) => pki
                .serve(config, free_port(), false)
                .arg("tls-replication", "yes"),
            None => config,
        };
        let primary = RedisServer::start_with(config(ServerConfig::new()));
        let mut servers = vec![primary];
        for _ in 0..replicas {
            let replica = config(ServerConfig::new().replica_of(servers[0].announced_port()));
            servers.push(RedisServer::start_with(replica));
        }
        // Sentinels learn about replicas from the primary's INFO, which they
        // ask for at once and then only every INFO_PERIOD: the replicas must
        // be listed there before the sentinels start.
        for replica in &servers[1..] {
            replica.wait_for_replica_sync();
        }
        // Streaming too, so that a write the primary acknowledges can be
        // waited for (`WAIT`) from the start.
        servers[0].wait_for_replicas(replicas);
        let sentinels = (0..SENTINELS)
            .map(|_| SentinelProcess::start(servers[0].announced_port(), down_after, pki.as_ref()))
            .collect();
        // Built before waiting, so that a panic below cleans up everything.
        let group = SentinelGroup {
            sentinels,
            servers,
            primary: 0,
            pki,
        };
        group.wait_until_discovered();
        group
    }

    /// `redis-sentinel://127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>/distlock-primary`; for a
    /// TLS group, `rediss-sentinel://` and the sentinels' TLS ports.
    pub fn sentinel_url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.announced_port()))
            .collect();
        let scheme = match self.pki {
            Some(_) => "rediss-sentinel",
            None => "redis-sentinel",
        };
        format!("{scheme}://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// A TLS group's certificates: its CA signed every server's and sentinel's.
    pub fn pki(&self) -> Option<&TestPki> {
        self.pki.as_ref()
    }

    /// The sentinels' addresses, `127.0.0.1:<port>` each.
    pub fn sentinel_addrs(&self) -> Vec<SocketAddr> {
        self.sentinels.iter().map(SentinelProcess::addr).collect()
    }

    /// The server that is primary as far as the harness knows: the original
    /// one, or the promoted replica after
    /// [`SentinelGroup::kill_primary_and_wait_failover`].
    pub fn primary(&self) -> &RedisServer {
        &self.servers[self.primary]
    }

    /// The first server that is not the primary: the replica, or (with one
    /// replica) the killed former primary after a failover.
    pub fn replica(&self) -> &RedisServer {
        &self.servers[self.first_other()]
    }

    /// Every server that is not the primary.
    pub fn replicas(&self) -> impl Iterator<Item = &RedisServer> {
        let primary = self.primary;
        self.servers
            .iter()
            .enumerate()
            .filter(move |(index, _)| *index != primary)
            .map(|(_, server)| server)
    }

    /// The primary, e.g. to pause it; see the type's doc on role tracking.
    pub fn primary_mut(&mut self) -> &mut RedisServer {
        &mut self.servers[self.primary]
    }

    /// The replica (or killed former primary), e.g. to restart the latter.
    ///
    /// A restart keeps the server's original configuration: the first primary
    /// comes back as an empty master, which the sentinels turn into a replica
    /// of the current primary after a while (watch for
    /// [`RedisServer::wait_for_replica_sync`] before another failover).
    pub fn replica_mut(&mut self) -> &mut RedisServer {
        let other = self.first_other();
        &mut self.servers[other]
    }

    fn first_other(&self) -> usize {
        usize::from(self.primary == 0)
    }

    /// SIGKILLs the primary and waits until the sentinels have promoted the
    /// replica: until every sentinel has logged `+switch-master` (so any of
    /// them now names the replica) and the replica has logged that it is a
    /// master. Then swaps the roles, so that [`SentinelGroup::primary`] is the
    /// promoted server and [`SentinelGroup::replica`] the killed one.
    ///
    /// Returns the time from the kill until the first sentinel's
    /// `+switch-master` line arrived: `down_after`, plus up to a second or so
    /// each for agreeing on the failure, electing a leader and seeing the
    /// promotion (1–2 s in all with a `down_after` of 500 ms).
    ///
    /// # Panics
    ///
    /// If the primary is not running or the replica is not running (there
    /// would be no failover to wait for), or if the failover does not complete
    /// within 30 s; the message quotes the sentinels' logs.
    pub fn kill_primary_and_wait_failover(&mut self) -> Duration {
        let old = self.primary().port();
        assert!(
            self.primary().is_running(),
            "kill_primary_and_wait_failover: the primary on port {old} is not running"
        );
        assert!(
            self.replicas().any(RedisServer::is_running),
            "kill_primary_and_wait_failover: no replica is running, so the sentinels have \
             nothing to promote"
        );
        self.switch_after("killing the primary", |group| group.primary_mut().kill())
    }

    /// Stops (SIGSTOP) every replica: the primary goes on answering, and what it writes from
    /// now on reaches no replica — a replication link that lags.
    pub fn pause_replicas(&self) {
        for replica in self.replicas() {
            replica.pause();
        }
    }

    /// SIGKILLs the primary while its replicas are paused ([`SentinelGroup::pause_replicas`]),
    /// resumes them, and waits for the failover as
    /// [`SentinelGroup::kill_primary_and_wait_failover`] does: the promoted replica lacks
    /// every write the primary made while they were paused.
    pub fn kill_lagging_primary_and_wait_failover(&mut self) -> Duration {
        self.switch_after("killing the primary of paused replicas", |group| {
            group.primary_mut().kill();
            let primary = group.primary;
            for (index, server) in group.servers.iter().enumerate() {
                if index != primary {
                    server.resume();
                }
            }
        })
    }

    /// Starts the killed former primary again and waits until it has synced as a replica of
    /// the current primary (the sentinels turn the empty master it comes back as into one).
    ///
    /// # Panics
    ///
    /// If every server is running, or the restarted one does not sync.
    pub fn restart_killed(&mut self) {
        let killed = self
            .servers
            .iter()
            .position(|server| !server.is_running())
            .expect("restart_killed: every server is running");
        self.servers[killed].restart();
        self.servers[killed].wait_for_replica_sync();
    }

    /// Asks a sentinel for a failover with the primary alive (`SENTINEL
    /// FAILOVER`): a replica is promoted and the old primary demoted to a
    /// replica of it, its clients still connected. Waits and swaps the roles
    /// as [`SentinelGroup::kill_primary_and_wait_failover`] does, and returns
    /// the time from the request to the first `+switch-master`.
    ///
    /// # Panics
    ///
    /// If the sentinel refuses, or the switch does not complete within 30 s.
    pub fn fail_over_and_wait(&mut self) -> Duration {
        self.switch_after("asking for a failover", |group| {
            let sentinel = &group.sentinels[0];
            let reply = command_at(
                sentinel.addr(),
                &["SENTINEL", "FAILOVER", MASTER_NAME],
                COMMAND_TIMEOUT,
            );
            assert!(
                matches!(reply, Ok(Reply::Simple(ref ok)) if ok == "OK"),
                "sentinel on port {}: SENTINEL FAILOVER answered {reply:?}",
                sentinel.port
            );
        })
    }

    /// Runs `cause`, then waits until every sentinel announced a new primary
    /// and that server logged its promotion; swaps the roles. Returns the time
    /// from `cause` to the first announcement.
    fn switch_after(&mut self, what: &str, cause: impl FnOnce(&mut Self)) -> Duration {
        let old = self.primary().announced_port();
        // A sentinel logs this line again for a later failover between the
        // same two servers: only lines after these marks count.
        let marks: Vec<usize> = self
            .sentinels
            .iter()
            .map(|s| s.child.output_len())
            .collect();
        // The sentinels choose the replica; its port ends the line.
        let switched = format!("+switch-master {MASTER_NAME} 127.0.0.1 {old} 127.0.0.1 ");

        let killed_at = Instant::now();
        cause(self);
        let deadline = killed_at + FAILOVER_DEADLINE;
        let Some(switched_at) = self.first_to_log(&switched, &marks, deadline) else {
            panic!(
                "no sentinel logged {switched:?} within {FAILOVER_DEADLINE:?} of {what}; \
                 replica log:\n{}\n{}",
                tail(&self.replica().log()),
                self.sentinel_tails()
            );
        };
        for (sentinel, &mark) in self.sentinels.iter().zip(&marks) {
            sentinel.wait_for_log(&switched, mark, deadline);
        }
        let announced = self.sentinels[0].child.output();
        let new: u16 = announced[marks[0]..]
            .lines()
            .find_map(|line| Some(line.split_once(switched.as_str())?.1.trim()))
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("no port after {switched:?} in:\n{announced}"));
        let promoted = self
            .servers
            .iter()
            .position(|server| server.announced_port() == new)
            .unwrap_or_else(|| panic!("the sentinels promoted port {new}, not one of ours"));
        self.servers[promoted].wait_for_log(PROMOTED_LINE);
        self.primary = promoted;
        switched_at - killed_at
    }

    /// The primary's address according to a sentinel
    /// (`SENTINEL get-master-addr-by-name`).
    ///
    /// # Panics
    ///
    /// If the sentinel does not answer with an address within 10 s.
    pub fn master_addr_by_sentinel(&self) -> SocketAddr {
        let sentinel = &self.sentinels[0];
        let reply = command_at(
            sentinel.addr(),
            &["SENTINEL", "get-master-addr-by-name", MASTER_NAME],
            COMMAND_TIMEOUT,
        )
        .unwrap_or_else(|e| {
            panic!(
                "sentinel on port {}: get-master-addr-by-name failed: {e}; log:\n{}",
                sentinel.port,
                tail(&sentinel.child.output())
            )
        });
        parse_addr(&reply).unwrap_or_else(|| {
            panic!(
                "sentinel on port {}: get-master-addr-by-name answered {reply:?}; log:\n{}",
                sentinel.port,
                tail(&sentinel.child.output())
            )
        })
    }

    /// Every sentinel's complete log, each under a header line, for panic
    /// messages.
    pub fn sentinel_logs(&self) -> String {
        self.sentinels
            .iter()
            .map(|s| format!("{}\n{}", s.header(), s.child.output()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until each sentinel has logged the replica and both other
    /// sentinels.
    fn wait_until_discovered(&self) {
        let deadline = Instant::now() + DISCOVERY_DEADLINE;
        let primary = self.primary().announced_port();
        let at = format!("@ {MASTER_NAME} 127.0.0.1 {primary}");
        for sentinel in &self.sentinels {
            for replica in self.replicas().map(RedisServer::announced_port) {
                sentinel.wait_for_log(
                    &format!("+slave slave 127.0.0.1:{replica} 127.0.0.1 {replica} {at}"),
                    0,
                    deadline,
                );
            }
            for other in self.sentinels.iter().filter(|o| o.port != sentinel.port) {
                sentinel.wait_for_log(
                    &format!(
                        "+sentinel sentinel {} 127.0.0.1 {} {at}",
                        other.id,
                        other.announced_port()
                    ),
                    0,
                    deadline,
                );
            }
        }
    }

    /// When the first sentinel logged `needle` after its mark, or `None` if
    /// none did by `deadline`.
    fn first_to_log(&self, needle: &str, marks: &[usize], deadline: Instant) -> Option<Instant> {
        let (found, first) = mpsc::channel();
        for (sentinel, &mark) in self.sentinels.iter().zip(marks) {
            let (child, needle, found) = (
                Arc::clone(&sentinel.child),
                needle.to_owned(),
                found.clone(),
            );
            // Each watcher ends when its sentinel logs the line, exits (at the
            // latest when the group is dropped) or the deadline passes.
            thread::Builder::new()
                .name(format!("sentinel-{}-watch", sentinel.port))
                .spawn(move || {
                    if let Outcome::Found = child.wait_for_output_after(&needle, mark, deadline) {
                        let _ = found.send(Instant::now());
                    }
                })
                .unwrap_or_else(|e| panic!("cannot start a thread to watch a sentinel: {e}"));
        }
        drop(found);
        // Err once every watcher has ended without finding the line.
        first.recv().ok()
    }

    fn sentinel_tails(&self) -> String {
        self.sentinels
            .iter()
            .map(|s| format!("{}\n{}", s.header(), tail(&s.child.output())))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The sentinels' ping period for a given `down-after-milliseconds`.
///
/// Redis 7.0 sentinels reconnect to an instance at most once per ping period
/// (1 s by default), including to the replica they just promoted: after a
/// failover the new primary goes unanswered for up to that long, and with a
/// shorter `down_after` the sentinels declare it down and start a failover
/// of their own (with the old primary restarted by then, they promote that).
/// Half of `down_after` avoids this. The floor is because a replica is only
/// promoted if its last `INFO` reply (asked for every second during a
/// failover) is younger than five ping periods; so below about 400 ms of
/// `down_after` the quirk remains possible.
fn ping_period(down_after: Duration) -> Duration {
    (down_after / 2).clamp(MIN_PING_PERIOD, MAX_PING_PERIOD)
}

/// `[ip, port]` as answered by `SENTINEL get-master-addr-by-name`.
fn parse_addr(reply: &Reply) -> Option<SocketAddr> {
    let [ip, port] = reply.as_array()? else {
        return None;
    };
    let ip: Ipv4Addr = ip.as_str()?.parse().ok()?;
    let port: u16 = port.as_str()?.parse().ok()?;
    Some(SocketAddr::from((ip, port)))
}

/// One `redis-server --sentinel` process with its own port and temp dir.
///
/// Dropping it SIGKILLs the process by PID, reaps it and removes its temp dir.
struct SentinelProcess {
    port: u16,
    /// The TLS port of a sentinel of a TLS group: the one it announces and clients use.
    tls_port: Option<u16>,
    /// Holds the config file the sentinel rewrites.
    dir: PathBuf,
    /// The sentinel's run ID, as it announces itself to the others.
    id: String,
    child: Arc<Child>,
}

impl fmt::Debug for SentinelProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelProcess")
            .field("port", &self.port)
            .field("pid", &self.child.pid())
            .field("running", &self.child.is_running())
            .field("dir", &self.dir)
            .finish()
    }
}

impl SentinelProcess {
    /// Starts a sentinel monitoring the master on `127.0.0.1:<primary>`,
    /// waits until it logs that it does, and sets its timing.
    fn start(primary: u16, down_after: Duration, pki: Option<&TestPki>) -> SentinelProcess {
        let dir = make_temp_dir();
        let mut last_output = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port();
            let tls = pki.map(|pki| (free_port(), pki));
            match launch_sentinel(primary, down_after.as_millis(), port, tls, &dir) {
                Ok((child, id)) => {
                    let sentinel = SentinelProcess {
                        port,
                        tls_port: tls.map(|(port, _)| port),
                        dir,
                        id,
                        child,
                    };
                    sentinel.set_timing(down_after);
                    return sentinel;
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
            "redis sentinel: every one of {PORT_ATTEMPTS} free ports was taken before it could bind; last log:\n{}",
            tail(&last_output)
        );
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The port the sentinel announces to the others, and clients use.
    fn announced_port(&self) -> u16 {
        self.tls_port.unwrap_or(self.port)
    }

    /// Shortens the sentinel's internal periods (they are not config-file
    /// options) so that a test's group settles in well under a second and
    /// avoids the ping-period quirk described at [`ping_period`]. Sentinels
    /// before Redis 7.0 lack `SENTINEL DEBUG` and keep their defaults.
    ///
    /// # Panics
    ///
    /// If the sentinel does not answer.
    fn set_timing(&self, down_after: Duration) {
        let ms = |d: Duration| d.as_millis().to_string();
        let (ping, hello, info) = (
            ms(ping_period(down_after)),
            ms(HELLO_PERIOD),
            ms(INFO_PERIOD),
        );
        let args = [
            "SENTINEL",
            "DEBUG",
            "ping-period",
            &ping,
            "publish-period",
            &hello,
            "info-period",
            &info,
        ];
        if let Err(e) = command_at(self.addr(), &args, COMMAND_TIMEOUT) {
            panic!(
                "sentinel on port {}: {args:?} failed: {e}; log:\n{}",
                self.port,
                tail(&self.child.output())
            );
        }
    }

    fn header(&self) -> String {
        format!(
            "--- sentinel 127.0.0.1:{} (PID {}) ---",
            self.port,
            self.child.pid()
        )
    }

    /// Waits until the sentinel has logged `needle` after its first `mark`
    /// bytes of output.
    ///
    /// # Panics
    ///
    /// If it does not by `deadline`, or exits first.
    fn wait_for_log(&self, needle: &str, mark: usize, deadline: Instant) {
        match self.child.wait_for_output_after(needle, mark, deadline) {
            Outcome::Found => {}
            Outcome::Exited(status) => panic!(
                "sentinel on port {} exited ({status}) before logging {needle:?}; log:\n{}",
                self.port,
                tail(&self.child.output())
            ),
            Outcome::TimedOut => panic!(
                "sentinel on port {} did not log {needle:?} in time; log:\n{}",
                self.port,
                tail(&self.child.output())
            ),
        }
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        // Never panic here: a drop during unwinding would abort the test binary.
        if self.child.signal(libc::SIGKILL) && self.child.wait_exit(KILL_DEADLINE).is_none() {
            eprintln!(
                "redis sentinel PID {} survived SIGKILL for {KILL_DEADLINE:?}",
                self.child.pid()
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes a sentinel config into `dir`, runs the sentinel on `port` and waits
/// until it monitors the primary; returns the process and the sentinel's ID.
fn launch_sentinel(
    primary: u16,
    down_after_ms: u128,
    port: u16,
    tls: Option<(u16, &TestPki)>,
    dir: &Path,
) -> Result<(Arc<Child>, String), Failure> {
    // Only the `sentinel` directives live in the file (they must, and in this
    // order); the rest goes on the command line like for RedisServer, where
    // redis-server quotes the values itself. The file is rewritten on each
    // attempt: a sentinel that failed to bind has not touched it.
    let config = dir.join("sentinel.conf");
    let failover_timeout_ms = FAILOVER_TIMEOUT.as_millis();
    let directives = format!(
        "sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} {QUORUM}\n\
         sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}\n\
         sentinel failover-timeout {MASTER_NAME} {failover_timeout_ms}\n\
         sentinel parallel-syncs {MASTER_NAME} 1\n"
    );
    std::fs::write(&config, directives).map_err(|e| {
        Failure::Other(format!(
            "cannot write the sentinel config {}: {e}",
            config.display()
        ))
    })?;
    let mut command = Command::new(redis_server_binary());
    command
        .arg(&config)
        .arg("--sentinel")
        .args(["--port", &port.to_string()])
        .args(["--bind", "127.0.0.1"])
        .arg("--dir")
        .arg(dir)
        .args(["--logfile", ""])
        .args(["--daemonize", "no"])
        .args(["--protected-mode", "no"]);
    if let Some((tls_port, pki)) = tls {
        // TLS to the servers and the other sentinels too, which it then tells its TLS port.
        command
            .args(["--tls-port", &tls_port.to_string()])
            .arg("--tls-cert-file")
            .arg(pki.server_cert())
            .arg("--tls-key-file")
            .arg(pki.server_key())
            .arg("--tls-ca-cert-file")
            .arg(pki.ca())
            .args(["--tls-auth-clients", "no", "--tls-replication", "yes"]);
    }
    let child = Child::spawn(command).map_err(|e| {
        Failure::Other(format!(
            "cannot run redis-server --sentinel ({e}); install redis-server \
             or point {REDIS_SERVER_ENV} at the binary"
        ))
    })?;
    let ready = format!("+monitor master {MASTER_NAME} 127.0.0.1 {primary} quorum {QUORUM}");
    match child.wait_for_output(&ready, Instant::now() + START_DEADLINE) {
        Outcome::Found => {}
        Outcome::Exited(_) if child.output().contains(PORT_TAKEN_LINE) => {
            return Err(Failure::PortTaken(child.output()))
        }
        Outcome::Exited(status) => {
            return Err(Failure::Other(format!(
                "redis sentinel on port {port} exited ({status}) before it monitored the primary; log:\n{}",
                tail(&child.output())
            )))
        }
        Outcome::TimedOut => {
            child.signal(libc::SIGKILL);
            child.wait_exit(KILL_DEADLINE);
            return Err(Failure::Other(format!(
                "redis sentinel on port {port} did not log {ready:?} within {START_DEADLINE:?}; log:\n{}",
                tail(&child.output())
            )));
        }
    }
    // Logged just before the +monitor line.
    let output = child.output();
    let id = output
        .split_once(ID_LINE)
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .map(str::to_owned);
    match id {
        Some(id) => Ok((child, id)),
        None => {
            child.signal(libc::SIGKILL);
            child.wait_exit(KILL_DEADLINE);
            Err(Failure::Other(format!(
                "redis sentinel on port {port} did not log {ID_LINE:?}; log:\n{}",
                tail(&output)
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_port_is_reported_as_such() {
        let squatter = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = squatter.local_addr().unwrap().port();
        let dir = make_temp_dir();
        // The sentinel exits before it would look for the (absent) primary.
        let result = launch_sentinel(free_port(), 500, port, None, &dir);
        std::fs::remove_dir_all(&dir).unwrap();
        match result {
            Err(Failure::PortTaken(log)) => assert!(log.contains(PORT_TAKEN_LINE), "{log}"),
            Err(Failure::Other(message)) => panic!("wrong failure: {message}"),
            Ok(_) => panic!("a sentinel bound a port that was in use"),
        }
    }

    #[test]
    fn ping_period_is_half_of_down_after_within_bounds() {
        let ms = Duration::from_millis;
        assert_eq!(ping_period(ms(100)), MIN_PING_PERIOD);
        assert_eq!(ping_period(ms(800)), ms(400));
        assert_eq!(ping_period(ms(30_000)), MAX_PING_PERIOD);
    }

    #[test]
    fn addresses_are_parsed_from_sentinel_replies() {
        let bulk = |s: &str| Reply::Bulk(Some(s.as_bytes().to_vec()));
        let reply = Reply::Array(Some(vec![bulk("127.0.0.1"), bulk("7000")]));
        assert_eq!(
            parse_addr(&reply),
            Some(SocketAddr::from(([127, 0, 0, 1], 7000)))
        );
        assert_eq!(parse_addr(&Reply::Array(None)), None);
    }
}
