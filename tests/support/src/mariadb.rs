//! MariaDB on loopback: a server of the harness's own (`mariadb-install-db` into a temp dir,
//! `mariadbd --no-defaults` on a free port and a socket in that dir), stopped, killed or paused
//! by PID — never the server a machine may run on 3306 or `/run/mysqld`.
//!
//! The binaries come from the distribution's packages: the directory [`MARIADB_BINDIR_ENV`]
//! names, else `/usr/sbin/mariadbd` and `mariadb-install-db` and `mariadb` on `PATH`.
//! `mariadbd` refuses to run as root unless told to; a harness running as root passes
//! `--user=root`. Data lives in `/dev/shm` where there is one, and commits reach the kernel, not
//! the disk (`innodb_flush_log_at_trx_commit=2`): a killed server loses nothing it committed,
//! which is all these tests kill.

use crate::ports::free_port;
use crate::process::{Child, Outcome};
use crate::server::{make_temp_dir, make_temp_dir_in, tail, KILL_DEADLINE};
use crate::tls::{ServerCert, TestPki};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Environment variable naming the directory of MariaDB's binaries (`mariadbd`,
/// `mariadb-install-db`, `mariadb`).
pub const MARIADB_BINDIR_ENV: &str = "DISTLOCK_MARIADB_BINDIR";

/// What the server logs once it takes connections.
const READY_LINE: &str = "ready for connections";
/// What the server logs when its port is taken.
const PORT_TAKEN: &str = "Address already in use";
/// Starts of a new server, each on another port when the last found its port taken.
const BIND_ATTEMPTS: usize = 5;
const START_DEADLINE: Duration = Duration::from_secs(30);
/// The database [`MariaDbServer::url`] names and [`MariaDbServer::sql`] runs in.
const DATABASE: &str = "test";
/// The server's answer to a `KILL` of a connection that has already ended.
const UNKNOWN_THREAD: &str = "ERROR 1094";

/// A MariaDB server of the harness's own; dropping it kills the server and removes its dir.
pub struct MariaDbServer {
    port: u16,
    dir: PathBuf,
    child: Option<Arc<Child>>,
    /// Server options given at every start, after the harness's own.
    args: Vec<OsString>,
}

impl MariaDbServer {
    /// A new server (`mariadb-install-db`), started, with a database `test` and a superuser
    /// `root` that needs no password, over the socket or over TCP from 127.0.0.1.
    ///
    /// # Panics
    /// If the binaries cannot be run, or the server is not ready within 30 s (with its log).
    pub fn start() -> MariaDbServer {
        MariaDbServer::start_with(&[])
    }

    /// [`start`](Self::start) with more server options (`--name=value`), which come after the
    /// harness's own and so override them.
    pub fn start_with(args: &[&str]) -> MariaDbServer {
        MariaDbServer::start_configured(args, None)
    }

    /// A new server that takes TCP connections over TLS only (`require_secure_transport`),
    /// presenting `which` certificate of `pki`; the harness's own `mariadb` goes through the
    /// Unix socket, which counts as secure.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_tls(pki: &TestPki, which: ServerCert) -> MariaDbServer {
        MariaDbServer::start_configured(&[], Some((pki, which)))
    }

    fn start_configured(args: &[&str], tls: Option<(&TestPki, ServerCert)>) -> MariaDbServer {
        // Made before anything can fail, so that dropping it removes the dir.
        let mut server = MariaDbServer {
            port: free_port(),
            dir: new_dir(),
            child: None,
            args: Vec::new(),
        };
        server.install();
        if let Some((pki, which)) = tls {
            let [ca, cert, key] = install_certificate(&server.dir, pki, which);
            server.args.extend([
                option("--ssl-ca=", &ca),
                option("--ssl-cert=", &cert),
                option("--ssl-key=", &key),
                "--require-secure-transport=ON".into(),
            ]);
        }
        server.args.extend(args.iter().map(OsString::from));
        // The port was free when picked, but another process may have bound it since (see
        // `ports`): a first start that finds it taken starts again on another.
        for _ in 1..BIND_ATTEMPTS {
            match server.try_launch() {
                Ok(()) => break,
                Err(log) if log.contains(PORT_TAKEN) => server.port = free_port(),
                Err(log) => panic!("mariadbd on port {} did not start:\n{log}", server.port),
            }
        }
        if server.child.is_none() {
            server.launch();
        }
        server.run_sql(
            &format!(
                "CREATE DATABASE IF NOT EXISTS {DATABASE}; \
                 CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY ''; \
                 GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION"
            ),
            None,
        );
        server
    }

    /// The server's own temp dir: servers starting side by side must not share `/tmp`, where
    /// `mariadb-install-db` keeps temporary tables another server's start could remove.
    fn tmp(&self) -> PathBuf {
        let tmp = self.dir.join("tmp");
        std::fs::create_dir_all(&tmp).unwrap_or_else(|e| panic!("cannot make {tmp:?}: {e}"));
        tmp
    }

    /// Makes the data dir: system tables, `root@localhost` and `root@127.0.0.1` without a
    /// password, no `test` database yet.
    fn install(&self) {
        let mut command = Command::new(bin("mariadb-install-db"));
        command
            .arg("--no-defaults")
            .arg(option("--datadir=", &self.data()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .arg(option("--tmpdir=", &self.tmp()))
            .args(user_option());
        if std::env::var_os(MARIADB_BINDIR_ENV).is_some() {
            // The script bootstraps with the mariadbd it finds beside itself or in /usr/sbin;
            // the datadir is to be made by the server that runs it.
            command.env("MYSQLD_BOOTSTRAP", bin("mariadbd"));
        }
        let output = command.output().unwrap_or_else(|e| {
            panic!(
                "cannot run mariadb-install-db ({e}); install MariaDB (`apt-get install \
                 mariadb-server`, as scripts/deps.sh does) or point {MARIADB_BINDIR_ENV} at its \
                 binaries"
            )
        });
        assert!(
            output.status.success(),
            "mariadb-install-db failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Starts the server on its port; panics with its log if it does not start.
    fn launch(&mut self) {
        if let Err(log) = self.try_launch() {
            panic!("mariadbd on port {} did not start:\n{log}", self.port);
        }
    }

    /// Starts the server on its port: `Err` with the end of its log (and how it ended) if it
    /// does not start.
    fn try_launch(&mut self) -> Result<(), String> {
        let mut command = Command::new(bin("mariadbd"));
        // --no-defaults has to come first: no my.cnf, so nothing of the machine's server.
        command
            .arg("--no-defaults")
            .arg(option("--datadir=", &self.data()))
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg(option("--socket=", &self.socket()))
            .arg(option("--pid-file=", &self.dir.join("mysqld.pid")))
            .args(["--skip-name-resolve", "--innodb-flush-log-at-trx-commit=2"])
            .args(["--innodb-buffer-pool-size=64M", "--max-connections=500"])
            .arg("--innodb-log-file-size=16M")
            .arg(option("--tmpdir=", &self.tmp()))
            .args(user_option())
            .args(&self.args);
        // Without --log-error the server logs to stderr, which the Child collects.
        let child = Child::spawn(command).unwrap_or_else(|e| {
            panic!(
                "cannot run mariadbd ({e}); install MariaDB (`apt-get install mariadb-server`, \
                 as scripts/deps.sh does) or point {MARIADB_BINDIR_ENV} at its binaries"
            )
        });
        match child.wait_for_output(READY_LINE, Instant::now() + START_DEADLINE) {
            Outcome::Found => {}
            other => {
                child.signal(libc::SIGKILL);
                child.wait_exit(KILL_DEADLINE);
                return Err(format!("({other:?}) {}", tail(&child.output())));
            }
        }
        self.child = Some(child);
        Ok(())
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("mysqld.sock")
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `mysql://root@127.0.0.1:<port>/test`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/{DATABASE}", self.port)
    }

    /// The server's PID (a restart changes it).
    pub fn pid(&self) -> u32 {
        self.child().pid()
    }

    fn child(&self) -> &Arc<Child> {
        self.child.as_ref().expect("the server runs")
    }

    /// Whether the server process is alive (a paused server is alive).
    pub fn is_running(&self) -> bool {
        self.child.as_ref().is_some_and(|child| child.is_running())
    }

    /// Runs `sql` (one or more statements) with `mariadb` as `root` over the server's socket,
    /// in the database `test`; answers its output, trimmed: one row a line, columns separated
    /// by tabs, no headers.
    ///
    /// # Panics
    /// When the client fails (with its error).
    pub fn sql(&self, sql: &str) -> String {
        self.run_sql(sql, Some(DATABASE))
    }

    fn run_sql(&self, sql: &str, database: Option<&str>) -> String {
        let output = self.client(sql, database);
        assert!(
            output.status.success(),
            "mariadb failed on `{sql}`: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    fn client(&self, sql: &str, database: Option<&str>) -> Output {
        Command::new(bin("mariadb"))
            .arg("--no-defaults")
            .arg("-S")
            .arg(self.socket())
            .args(["-u", "root", "-N", "-B", "-e", sql])
            .args(database)
            .output()
            .unwrap_or_else(|e| panic!("cannot run mariadb ({e})"))
    }

    /// Ends every connection of `user` but the harness's own (`KILL CONNECTION`), as a network
    /// cut would; answers how many were ended. With `root`, that includes the connections of
    /// [`sql`](Self::sql) calls other threads are making.
    pub fn kill_connections(&self, user: &str) -> usize {
        let ids = self.sql(&format!(
            "SELECT ID FROM information_schema.PROCESSLIST \
             WHERE USER = {} AND ID <> CONNECTION_ID()",
            quote(user)
        ));
        ids.lines()
            .filter(|id| {
                let output = self.client(&format!("KILL CONNECTION {id}"), None);
                let error = String::from_utf8_lossy(&output.stderr);
                // A connection that ended since the SELECT is not one this ended.
                assert!(
                    output.status.success() || error.contains(UNKNOWN_THREAD),
                    "mariadb failed on `KILL CONNECTION {id}`: {error}"
                );
                output.status.success()
            })
            .count()
    }

    /// Stops the server at once, as a crash does (`SIGKILL`): the next start recovers from the
    /// InnoDB log; clients see their connections drop.
    pub fn kill(&mut self) {
        if let Some(child) = self.child.take() {
            child.signal(libc::SIGKILL);
            child.wait_exit(KILL_DEADLINE);
        }
    }

    /// Stops the server cleanly (`SIGTERM`: clients disconnected, buffers written), killing it
    /// if it has not exited 30 s later.
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            child.signal(libc::SIGTERM);
            // A paused server would hold the SIGTERM pending forever.
            child.signal(libc::SIGCONT);
            if child.wait_exit(START_DEADLINE).is_none() {
                child.signal(libc::SIGKILL);
                child.wait_exit(KILL_DEADLINE);
            }
        }
    }

    /// Starts the server again on the same port and data (stopping it first if it runs),
    /// waiting until it takes connections.
    ///
    /// # Panics
    /// As [`start`](Self::start), e.g. when another process took the port meanwhile.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// Freezes the server (`SIGSTOP`): connects still succeed (the kernel completes the
    /// handshake), but nothing is answered.
    ///
    /// # Panics
    /// If the server is not running.
    pub fn pause(&self) {
        assert!(
            self.child().signal(libc::SIGSTOP),
            "mariadbd is not running"
        );
    }

    /// Continues a paused server (`SIGCONT`).
    ///
    /// # Panics
    /// If the server is not running.
    pub fn resume(&self) {
        assert!(
            self.child().signal(libc::SIGCONT),
            "mariadbd is not running"
        );
    }

    /// The server's log so far (since its last start).
    pub fn log(&self) -> String {
        self.child
            .as_ref()
            .map(|child| child.output())
            .unwrap_or_default()
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Copies the CA and the server certificate `which` of `pki` into `dir`, where a restart still
/// finds them after `pki` is gone; answers the CA's, the certificate's and the key's paths.
fn install_certificate(dir: &Path, pki: &TestPki, which: ServerCert) -> [PathBuf; 3] {
    let (cert, key) = pki.server(which);
    [
        (pki.ca(), "ca.crt"),
        (cert, "server.crt"),
        (key, "server.key"),
    ]
    .map(|(from, to)| {
        let to = dir.join(to);
        std::fs::copy(&from, &to).unwrap_or_else(|e| panic!("cannot copy {from:?}: {e}"));
        to
    })
}

/// A temp dir for one server, on `/dev/shm` where there is one.
fn new_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    match shm.is_dir() {
        true => make_temp_dir_in(shm),
        false => make_temp_dir(),
    }
}

/// `--user=root` when the harness runs as root, without which `mariadbd` refuses to start.
fn user_option() -> Option<&'static str> {
    // SAFETY: geteuid(2) has no preconditions.
    (unsafe { libc::geteuid() } == 0).then_some("--user=root")
}

/// `name` (ending in `=`) followed by `path`, as one argument.
fn option(name: &str, path: &Path) -> OsString {
    let mut arg = OsString::from(name);
    arg.push(path);
    arg
}

/// `value` as an SQL string literal.
fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// A MariaDB binary: from [`MARIADB_BINDIR_ENV`]; else `mariadbd` from `/usr/sbin` (where
/// Debian puts it, off a user's `PATH`) and the others from `PATH`.
fn bin(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os(MARIADB_BINDIR_ENV) {
        return PathBuf::from(dir).join(name);
    }
    let sbin = Path::new("/usr/sbin").join(name);
    match name == "mariadbd" && sbin.exists() {
        true => sbin,
        false => PathBuf::from(name),
    }
}
