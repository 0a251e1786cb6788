//! A ZooKeeper ensemble on loopback: servers run from Debian's `zookeeper.jar` (the one
//! [`ZOOKEEPER_JAR_ENV`] names, else `/usr/share/java/zookeeper.jar`) with `java`, each with its
//! own client, quorum and election ports and its own data dir, stopped, killed or paused by
//! PID. Each server logs through slf4j-simple to its stderr, and is ready once its log says it
//! leads or follows; which server leads is asked of the servers themselves (`srvr`).
//!
//! The servers tick every 100 ms (so a session may last from 200 ms, a failover takes well under
//! a second), keep their data in `/dev/shm` where there is one, and have the admin server off.

use crate::ports::free_port;
use crate::process::{Child, Outcome};
use crate::server::{make_temp_dir, make_temp_dir_in, tail, KILL_DEADLINE};
use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Environment variable naming ZooKeeper's jar; without it, Debian's.
pub const ZOOKEEPER_JAR_ENV: &str = "DISTLOCK_ZOOKEEPER_JAR";

const DEBIAN_JAR: &str = "/usr/share/java/zookeeper.jar";
/// The slf4j binding that makes the server log to its stderr (Debian's libslf4j-java).
const LOGGER_JAR: &str = "/usr/share/java/slf4j-simple.jar";
const START_DEADLINE: Duration = Duration::from_secs(60);
/// What a server logs once an election placed it (`LEADING` or `FOLLOWING` in its peer state).
const PLACED: &str = "LEADER ELECTION TOOK";
/// What a new leader logs once a majority follows it.
const QUORUM: &str = "Have quorum of supporters";
/// Ensemble starts tried when a server finds its port taken.
const PORT_ATTEMPTS: usize = 5;

struct Server {
    client_port: u16,
    quorum_port: u16,
    election_port: u16,
    child: Option<Arc<Child>>,
}

/// A running ensemble; dropping it kills every server and removes the data dirs.
pub struct ZkEnsemble {
    servers: Vec<Server>,
    dir: PathBuf,
}

impl ZkEnsemble {
    /// Starts `size` servers (one: standalone) and waits until each leads or follows.
    ///
    /// # Panics
    ///
    /// If `java` or the jar cannot be run, or a server is not placed within 60 s (with its
    /// log's tail).
    pub fn start(size: usize) -> ZkEnsemble {
        for _ in 0..PORT_ATTEMPTS {
            match ZkEnsemble::try_start(size) {
                Ok(ensemble) => return ensemble,
                Err(why) if why.contains("Address already in use") => {}
                Err(why) => panic!("{why}"),
            }
        }
        panic!("zookeeper: a port was taken {PORT_ATTEMPTS} times in a row");
    }

    fn try_start(size: usize) -> Result<ZkEnsemble, String> {
        let shm = Path::new("/dev/shm");
        let dir = match shm.is_dir() {
            true => make_temp_dir_in(shm),
            false => make_temp_dir(),
        };
        let servers = (0..size)
            .map(|_| Server {
                client_port: free_port(),
                quorum_port: free_port(),
                election_port: free_port(),
                child: None,
            })
            .collect();
        let mut ensemble = ZkEnsemble { servers, dir };
        for i in 0..size {
            ensemble.configure(i);
            ensemble.servers[i].child = Some(ensemble.spawn(i));
        }
        for i in 0..size {
            ensemble.placed(i)?;
        }
        Ok(ensemble)
    }

    /// Writes server `i`'s `zoo.cfg` and `myid`.
    fn configure(&self, i: usize) {
        let data = self.dir.join(format!("zk{i}"));
        std::fs::create_dir_all(&data).expect("data dir");
        std::fs::write(data.join("myid"), format!("{}\n", i + 1)).expect("myid");
        let mut config = format!(
            "tickTime=100\ninitLimit=50\nsyncLimit=10\ndataDir={}\nclientPort={}\n\
             clientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
             4lw.commands.whitelist=srvr,ruok,stat,cons\nminSessionTimeout=200\n\
             maxSessionTimeout=1200000\nforceSync=no\n",
            data.display(),
            self.servers[i].client_port
        );
        if self.servers.len() > 1 {
            for (n, server) in self.servers.iter().enumerate() {
                config.push_str(&format!(
                    "server.{}=127.0.0.1:{}:{}\n",
                    n + 1,
                    server.quorum_port,
                    server.election_port
                ));
            }
        }
        std::fs::write(data.join("zoo.cfg"), config).expect("zoo.cfg");
    }

    fn spawn(&self, i: usize) -> Arc<Child> {
        let jar = std::env::var_os(ZOOKEEPER_JAR_ENV).unwrap_or_else(|| OsString::from(DEBIAN_JAR));
        let mut classpath = jar.clone();
        classpath.push(":");
        classpath.push(LOGGER_JAR);
        let data = self.dir.join(format!("zk{i}"));
        let mut command = Command::new("java");
        command
            .arg("-Xmx256m")
            .arg("-XX:+UseSerialGC")
            .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=info")
            .arg("-Dzookeeper.jmx.log4j.disable=true")
            .arg(format!("-Dzookeeper.log.dir={}", data.display()))
            .arg("-cp")
            .arg(&classpath)
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(data.join("zoo.cfg"));
        Child::spawn(command).unwrap_or_else(|e| {
            panic!(
                "cannot run java with {} ({e}); install ZooKeeper (`apt-get install zookeeper`, \
                 as scripts/test.sh does) or point {ZOOKEEPER_JAR_ENV} at its jar",
                jar.to_string_lossy()
            )
        })
    }

    /// Waits until server `i` leads, follows or (alone) serves; what its log says if not.
    fn placed(&self, i: usize) -> Result<(), String> {
        let child = self.servers[i].child.as_ref().expect("started");
        let needle = match self.servers.len() {
            1 => "binding to port",
            _ => PLACED,
        };
        match child.wait_for_output(needle, Instant::now() + START_DEADLINE) {
            Outcome::Found => Ok(()),
            outcome => Err(format!(
                "zookeeper server {i} (client port {}) not placed ({outcome:?}); log:\n{}",
                self.servers[i].client_port,
                tail(&child.output())
            )),
        }
    }

    /// `zookeeper://127.0.0.1:port,…` of every server.
    pub fn url(&self) -> String {
        format!("zookeeper://{}", self.hosts().join(","))
    }

    /// `127.0.0.1:port` of every server.
    pub fn hosts(&self) -> Vec<String> {
        self.servers
            .iter()
            .map(|server| format!("127.0.0.1:{}", server.client_port))
            .collect()
    }

    /// Server `i`'s client port.
    pub fn client_port(&self, i: usize) -> u16 {
        self.servers[i].client_port
    }

    /// What server `i` answers to a four-letter command (`srvr`), or why it did not.
    pub fn four_letters(&self, i: usize, command: &str) -> Result<String, String> {
        let addr = ("127.0.0.1", self.servers[i].client_port);
        let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        stream
            .write_all(command.as_bytes())
            .map_err(|e| e.to_string())?;
        let mut answer = String::new();
        stream
            .read_to_string(&mut answer)
            .map_err(|e| e.to_string())?;
        Ok(answer)
    }

    /// The server that leads now, as the live servers say (`Mode: leader`), waiting for an
    /// election that is under way: a new leader logs that it has a quorum of supporters, and
    /// then answers `srvr` once it serves (each line it logs meanwhile is a look again).
    ///
    /// # Panics
    ///
    /// If no server says it leads within 60 s.
    pub fn leader(&self) -> usize {
        let deadline = Instant::now() + START_DEADLINE;
        let running: Vec<(usize, Arc<Child>, usize)> = (0..self.servers.len())
            .filter(|&i| self.is_running(i))
            .map(|i| {
                let child = self.servers[i].child.clone().expect("runs");
                let mark = child.output_len();
                (i, child, mark)
            })
            .collect();
        if let Some(i) = running.iter().map(|(i, ..)| *i).find(|&i| self.leads(i)) {
            return i;
        }
        let (found, elected) = std::sync::mpsc::channel();
        for (i, child, mark) in running {
            let found = found.clone();
            std::thread::spawn(move || {
                if let Outcome::Found = child.wait_for_output_after(QUORUM, mark, deadline) {
                    let _ = found.send((i, child));
                }
            });
        }
        drop(found);
        let (i, child) = elected
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("no ZooKeeper server leads"));
        loop {
            let mark = child.output_len();
            if self.leads(i) {
                return i;
            }
            let outcome = child.wait_for_output_after("\n", mark, deadline);
            assert!(
                matches!(outcome, Outcome::Found),
                "server {i} has a quorum but never said it leads ({outcome:?})"
            );
        }
    }

    /// Whether server `i` answers `srvr` as the leader.
    fn leads(&self, i: usize) -> bool {
        self.four_letters(i, "srvr")
            .is_ok_and(|answer| answer.contains("Mode: leader"))
    }

    /// The PIDs of the servers that run.
    pub fn pids(&self) -> Vec<u32> {
        self.servers
            .iter()
            .filter_map(|s| s.child.as_ref().filter(|c| c.is_running()).map(|c| c.pid()))
            .collect()
    }

    /// Whether server `i` runs.
    pub fn is_running(&self, i: usize) -> bool {
        self.servers[i]
            .child
            .as_ref()
            .is_some_and(|child| child.is_running())
    }

    /// Kills server `i` (SIGKILL) and waits for its exit.
    pub fn kill(&mut self, i: usize) {
        if let Some(child) = &self.servers[i].child {
            if child.signal(libc::SIGKILL) {
                assert!(
                    child.wait_exit(KILL_DEADLINE).is_some(),
                    "zookeeper server {i} survived SIGKILL"
                );
            }
        }
    }

    /// Starts killed server `i` again from its data dir and waits until it is placed.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.servers[i].child = Some(self.spawn(i));
        if let Err(why) = self.placed(i) {
            panic!("{why}");
        }
    }

    /// Freezes server `i` (SIGSTOP): its connections stay open and nothing is answered.
    pub fn pause(&self, i: usize) {
        let child = self.servers[i].child.as_ref().expect("started");
        assert!(child.signal(libc::SIGSTOP), "server {i} is not running");
    }

    /// Continues paused server `i` (SIGCONT).
    pub fn resume(&self, i: usize) {
        let child = self.servers[i].child.as_ref().expect("started");
        assert!(child.signal(libc::SIGCONT), "server {i} is not running");
    }

    /// The log of server `i`, for failure messages.
    pub fn log(&self, i: usize) -> String {
        self.servers[i]
            .child
            .as_ref()
            .map(|child| child.output())
            .unwrap_or_default()
    }
}

impl Drop for ZkEnsemble {
    fn drop(&mut self) {
        for i in 0..self.servers.len() {
            if let Some(child) = &self.servers[i].child {
                // A paused server takes SIGKILL too.
                child.signal(libc::SIGKILL);
                child.wait_exit(KILL_DEADLINE);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
