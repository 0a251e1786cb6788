//! An etcd cluster on loopback: members started from the `etcd` binary (from `PATH`, or the one
//! [`ETCD_ENV`] names), each with its own client and peer ports and its own data dir, stopped,
//! killed or paused by PID. Which member leads is asked of the members themselves
//! (`etcdctl endpoint status`, from `PATH` or [`ETCDCTL_ENV`]).
//!
//! [`EtcdCluster::start_tls`] serves clients over TLS only, and only clients with a certificate
//! signed by the test CA (`--client-cert-auth`); the members' peer traffic stays on loopback.
//!
//! The data dirs are in `/dev/shm` where there is one (etcd syncs each write before it answers,
//! and on a shared disk the syncs would set the pace). The members elect with a 50 ms heartbeat and a 500 ms election timeout, so a failover takes
//! about a second, and etcd's smallest lease is 1 s (one and a half election timeouts, rounded
//! up to whole seconds).

use crate::ports::free_port;
use crate::process::{Child, Outcome};
use crate::server::{make_temp_dir, make_temp_dir_in, tail, KILL_DEADLINE};
use crate::tls::{ServerCert, TestPki};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Environment variable naming the `etcd` binary; without it `etcd` is looked up on `PATH`.
pub const ETCD_ENV: &str = "DISTLOCK_ETCD";
/// Environment variable naming the `etcdctl` binary; without it `etcdctl` is looked up on `PATH`.
pub const ETCDCTL_ENV: &str = "DISTLOCK_ETCDCTL";

/// What a member logs once it serves clients (in a cluster: once it joined it).
const READY_LINE: &str = "serving client traffic";
const START_DEADLINE: Duration = Duration::from_secs(30);
/// How long a new leader may take to be elected and known to every live member.
const ELECTION_DEADLINE: Duration = Duration::from_secs(20);

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Arc<Child>>,
}

/// Cluster starts tried when a member finds its port taken.
const PORT_ATTEMPTS: usize = 5;

/// A running etcd cluster; dropping it kills every member and removes the data dirs.
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: PathBuf,
    initial_cluster: String,
    tls: Option<TlsFiles>,
}

/// The files of a TLS cluster: the members' certificate, and the client's (for etcdctl).
#[derive(Clone)]
struct TlsFiles {
    ca: PathBuf,
    server: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
}

impl EtcdCluster {
    /// Starts `size` members and waits until every one serves clients.
    ///
    /// # Panics
    ///
    /// If `etcd` cannot be run, or a member is not ready within 30 s (with its log's tail).
    pub fn start(size: usize) -> EtcdCluster {
        EtcdCluster::start_with(size, None)
    }

    /// Starts `size` members that serve clients over TLS only (`https://`, the certificate of
    /// `pki`'s server) and admit only clients with a certificate signed by `pki`'s CA.
    ///
    /// # Panics
    ///
    /// As [`EtcdCluster::start`].
    pub fn start_tls(size: usize, pki: &TestPki) -> EtcdCluster {
        EtcdCluster::start_tls_presenting(size, pki, ServerCert::Valid)
    }

    /// [`EtcdCluster::start_tls`], the members presenting `which` certificate.
    ///
    /// # Panics
    ///
    /// As [`EtcdCluster::start`].
    pub fn start_tls_presenting(size: usize, pki: &TestPki, which: ServerCert) -> EtcdCluster {
        let tls = TlsFiles {
            ca: pki.ca(),
            server: pki.server(which),
            client: (pki.client_cert(), pki.client_key()),
        };
        EtcdCluster::start_with(size, Some(tls))
    }

    fn start_with(size: usize, tls: Option<TlsFiles>) -> EtcdCluster {
        // A free port is only a hint: another process (the other lane of scripts/test.sh) may
        // bind it first. A member that finds its port taken starts the cluster over on new ones.
        for _ in 0..PORT_ATTEMPTS {
            match EtcdCluster::try_start(size, tls.clone()) {
                Ok(cluster) => return cluster,
                Err(why) if why.contains("address already in use") => {}
                Err(why) => panic!("{why}"),
            }
        }
        panic!("etcd: a port was taken {PORT_ATTEMPTS} times in a row");
    }

    fn try_start(size: usize, tls: Option<TlsFiles>) -> Result<EtcdCluster, String> {
        // etcd syncs every write to disk before it answers; on a shared disk that, not etcd,
        // would set every test's pace. Memory-backed dirs keep the syncs and lose their cost.
        let shm = Path::new("/dev/shm");
        let dir = match shm.is_dir() {
            true => make_temp_dir_in(shm),
            false => make_temp_dir(),
        };
        let members: Vec<Member> = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            members,
            dir,
            initial_cluster,
            tls,
        };
        for i in 0..size {
            let child = cluster.spawn(i, "new");
            cluster.members[i].child = Some(child);
        }
        for i in 0..size {
            cluster.ready(i)?;
        }
        Ok(cluster)
    }

    fn spawn(&self, i: usize, state: &str) -> Arc<Child> {
        let member = &self.members[i];
        let client = format!("{}://127.0.0.1:{}", self.scheme(), member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let data = self.dir.join(&member.name);
        let mut command = Command::new(binary(ETCD_ENV, "etcd"));
        command
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", state])
            .args([
                "--initial-cluster-token",
                &format!("distlock-{}", self.members[0].peer_port),
            ])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-outputs", "stderr"]);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.server.0)
                .arg("--key-file")
                .arg(&tls.server.1)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        Child::spawn(command).unwrap_or_else(|e| {
            panic!(
                "cannot run etcd ({e}); install it (`apt-get install etcd-server`, as \
                 scripts/test.sh does) or point {ETCD_ENV} at the binary"
            )
        })
    }

    fn wait_ready(&self, i: usize) {
        if let Err(why) = self.ready(i) {
            panic!("{why}");
        }
    }

    /// Waits until member `i` serves clients; what its log says if it does not.
    fn ready(&self, i: usize) -> Result<(), String> {
        let member = &self.members[i];
        let child = member.child.as_ref().expect("started");
        match child.wait_for_output(READY_LINE, Instant::now() + START_DEADLINE) {
            Outcome::Found => Ok(()),
            outcome => Err(format!(
                "etcd member {} (client port {}) not ready ({outcome:?}); log:\n{}",
                member.name,
                member.client_port,
                tail(&child.output())
            )),
        }
    }

    /// `127.0.0.1:port` of every member's client port, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// `etcd://127.0.0.1:port,…` with every member (`etcds://` for a TLS cluster).
    pub fn url(&self) -> String {
        let scheme = match self.tls {
            Some(_) => "etcds",
            None => "etcd",
        };
        format!("{scheme}://{}", self.endpoints().join(","))
    }

    /// For a TLS cluster, the CA, client certificate and client key a client presents.
    pub fn client_tls(&self) -> Option<(&Path, &Path, &Path)> {
        let tls = self.tls.as_ref()?;
        Some((&tls.ca, &tls.client.0, &tls.client.1))
    }

    /// `http[s]://127.0.0.1:port` of every member, as an etcd client dials them.
    pub fn client_urls(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("{}://127.0.0.1:{}", self.scheme(), m.client_port))
            .collect()
    }

    fn scheme(&self) -> &'static str {
        match self.tls {
            Some(_) => "https",
            None => "http",
        }
    }

    /// Runs `script` in `sh`, its `etcdctl` commands going to every live member (with the
    /// client certificate of a TLS cluster) as `user:password`, if given.
    ///
    /// # Panics
    ///
    /// If the script fails; the message quotes its output.
    pub fn etcdctl_script(&self, script: &str, user: Option<&str>) -> String {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!(
                "etcdctl() {{ command \"$DISTLOCK_ETCDCTL_BIN\" \"$@\"; }}\nset -e\n{script}"
            ))
            .env("DISTLOCK_ETCDCTL_BIN", binary(ETCDCTL_ENV, "etcdctl"));
        self.connect_etcdctl(&mut command);
        if let Some(user) = user {
            command.env("ETCDCTL_USER", user);
        }
        let output = command.output().expect("sh runs");
        assert!(
            output.status.success(),
            "the etcdctl script failed:\n{script}\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn etcdctl_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(binary(ETCDCTL_ENV, "etcdctl"));
        self.connect_etcdctl(&mut command);
        command
            .args(["--command-timeout", "2s", "--dial-timeout", "1s"])
            .args(args);
        command
    }

    /// Points the etcdctl of `command` (or of the script it runs) at every live member, with
    /// the client certificate of a TLS cluster: etcdctl reads its flags from `ETCDCTL_*`.
    fn connect_etcdctl(&self, command: &mut Command) {
        let endpoints: Vec<String> = (0..self.members.len())
            .filter(|&i| self.is_running(i))
            .map(|i| {
                format!(
                    "{}://127.0.0.1:{}",
                    self.scheme(),
                    self.members[i].client_port
                )
            })
            .collect();
        command
            .env("ETCDCTL_API", "3")
            .env("ETCDCTL_ENDPOINTS", endpoints.join(","));
        if let Some(tls) = &self.tls {
            command
                .env("ETCDCTL_CACERT", &tls.ca)
                .env("ETCDCTL_CERT", &tls.client.0)
                .env("ETCDCTL_KEY", &tls.client.1);
        }
    }

    /// The client port of member `i`.
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    /// The client address of member `i`: what a [`FaultProxy`](crate::FaultProxy) in front of
    /// it forwards to, to cut the member off from a client.
    pub fn client_addr(&self, i: usize) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.members[i].client_port))
    }

    /// The member that leads now, as the live members agree; waits (up to 20 s) for an
    /// election to settle.
    ///
    /// # Panics
    ///
    /// If no leader is agreed on in time.
    pub fn leader(&self) -> usize {
        let deadline = Instant::now() + ELECTION_DEADLINE;
        loop {
            // Marked before asking: a line logged while etcdctl asks wakes the next try.
            let watched = (0..self.members.len()).find(|&i| self.is_running(i));
            let child = watched.and_then(|i| self.members[i].child.clone());
            let mark = child.as_ref().map_or(0, |child| child.output_len());
            if let Some(leader) = self.agreed_leader() {
                return leader;
            }
            let child = child.expect("a live member");
            // An election in progress logs as it goes: ask again at its next line.
            if let Outcome::TimedOut = child.wait_for_output_after("\n", mark, deadline) {
                panic!("no etcd leader agreed on within {ELECTION_DEADLINE:?}");
            }
            assert!(
                Instant::now() < deadline,
                "no etcd leader agreed on within {ELECTION_DEADLINE:?}"
            );
        }
    }

    /// The leader every live member names, if they agree and it is live.
    fn agreed_leader(&self) -> Option<usize> {
        let live: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.is_running(i))
            .collect();
        let output = self
            .etcdctl_command(&["endpoint", "status", "-w", "simple"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run etcdctl ({e}); point {ETCDCTL_ENV} at it"));
        let text = String::from_utf8_lossy(&output.stdout);
        // `endpoint, id, version, db size, is leader, is learner, term, index, applied, errors`
        let rows: Vec<Vec<&str>> = text
            .lines()
            .map(|line| line.split(", ").collect())
            .filter(|row: &Vec<&str>| row.len() >= 5)
            .collect();
        if rows.len() != live.len() {
            return None;
        }
        let leaders: Vec<&Vec<&str>> = rows.iter().filter(|row| row[4] == "true").collect();
        let [leader] = leaders[..] else {
            return None;
        };
        let port: u16 = leader[0].rsplit(':').next()?.parse().ok()?;
        self.members.iter().position(|m| m.client_port == port)
    }

    /// The PIDs of the members that run, e.g. to place them on CPUs.
    pub fn pids(&self) -> Vec<u32> {
        self.members
            .iter()
            .filter_map(|m| m.child.as_ref().filter(|c| c.is_running()).map(|c| c.pid()))
            .collect()
    }

    /// Whether member `i` runs.
    pub fn is_running(&self, i: usize) -> bool {
        self.members[i]
            .child
            .as_ref()
            .is_some_and(|child| child.is_running())
    }

    /// Kills member `i` (SIGKILL) and waits for its exit.
    pub fn kill(&mut self, i: usize) {
        if let Some(child) = &self.members[i].child {
            if child.signal(libc::SIGKILL) {
                assert!(
                    child.wait_exit(KILL_DEADLINE).is_some(),
                    "etcd member {i} survived SIGKILL"
                );
            }
        }
    }

    /// Starts killed member `i` again from its data dir and waits until it serves clients.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        let child = self.spawn(i, "existing");
        self.members[i].child = Some(child);
        self.wait_ready(i);
    }

    /// Freezes member `i` (SIGSTOP): its connections stay open and nothing is answered.
    pub fn pause(&self, i: usize) {
        let child = self.members[i].child.as_ref().expect("started");
        assert!(child.signal(libc::SIGSTOP), "member {i} is not running");
    }

    /// Continues paused member `i` (SIGCONT).
    pub fn resume(&self, i: usize) {
        let child = self.members[i].child.as_ref().expect("started");
        assert!(child.signal(libc::SIGCONT), "member {i} is not running");
    }

    /// The log of member `i`, for failure messages.
    pub fn log(&self, i: usize) -> String {
        self.members[i]
            .child
            .as_ref()
            .map(|child| child.output())
            .unwrap_or_default()
    }

    /// The data dir of the cluster.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &self.members {
            if let Some(child) = &member.child {
                if child.signal(libc::SIGKILL) && child.wait_exit(KILL_DEADLINE).is_none() {
                    eprintln!("etcd PID {} survived SIGKILL", child.pid());
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn binary(env: &str, name: &str) -> OsString {
    std::env::var_os(env).unwrap_or_else(|| OsString::from(name))
}
