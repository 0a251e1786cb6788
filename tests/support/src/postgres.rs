//! PostgreSQL on loopback: a cluster of the harness's own (`initdb` into a temp dir, `postgres`
//! on a free port, stopped, killed or paused by PID) — never the server a machine may run on
//! 5432 — with streaming standbys (`pg_basebackup`) and PgBouncer in front where a test needs
//! them.
//!
//! The binaries come from the distribution's packages: the directory [`PG_BINDIR_ENV`] names,
//! else `pg_config --bindir`, else the newest `/usr/lib/postgresql/*/bin`. PostgreSQL refuses
//! to run as root; a harness running as root runs it (and PgBouncer) as the `postgres` user,
//! whose own files the temp dirs become. Data lives in `/dev/shm` where there is one, and
//! `fsync` is off: a killed server loses nothing the kernel already has, which is all these
//! tests kill.

use crate::ports::free_port;
use crate::process::{Child, Outcome};
use crate::server::{make_temp_dir, make_temp_dir_in, tail, KILL_DEADLINE};
use crate::tls::{ServerCert, TestPki};
use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Environment variable naming the directory of PostgreSQL's server binaries (`initdb`,
/// `postgres`, `pg_basebackup`, `pg_ctl`).
pub const PG_BINDIR_ENV: &str = "DISTLOCK_PG_BINDIR";
/// Environment variable naming the `pgbouncer` binary; without it `pgbouncer` on `PATH`.
pub const PGBOUNCER_ENV: &str = "DISTLOCK_PGBOUNCER";

/// What the server logs once it takes connections (a standby: once it takes read-only ones).
const READY_LINE: &str = "ready to accept";
const START_DEADLINE: Duration = Duration::from_secs(30);

/// A PostgreSQL server of the harness's own; dropping it kills the server and removes its dir.
pub struct PgServer {
    port: u16,
    dir: PathBuf,
    child: Option<Arc<Child>>,
    /// Settings given on the command line at every start (`-c name=value`).
    settings: Vec<(String, String)>,
}

impl PgServer {
    /// A new cluster (`initdb`), started and taking connections as the superuser `postgres`
    /// (trusted on loopback), with room for streaming standbys.
    ///
    /// # Panics
    /// If the binaries cannot be run, or the server is not ready within 30 s (with its log).
    pub fn start() -> PgServer {
        PgServer::start_with(&[])
    }

    /// [`start`](Self::start) with more server settings (`-c name=value`).
    pub fn start_with(settings: &[(&str, &str)]) -> PgServer {
        PgServer::start_configured(settings, None)
    }

    /// A new cluster that takes TCP connections over TLS only (`hostssl` in `pg_hba.conf`),
    /// presenting `which` certificate of `pki`; the harness's own `psql` goes through the Unix
    /// socket.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_tls(pki: &TestPki, which: ServerCert) -> PgServer {
        PgServer::start_configured(&[], Some((pki, which)))
    }

    fn start_configured(
        settings: &[(&str, &str)],
        tls: Option<(&TestPki, ServerCert)>,
    ) -> PgServer {
        let dir = new_dir();
        let data = dir.join("data");
        run_to_end(
            Command::new(bin("initdb")).arg("-D").arg(&data).args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ]),
            "initdb",
        );
        let host = match tls {
            Some(_) => "hostssl",
            None => "host",
        };
        std::fs::write(
            data.join("pg_hba.conf"),
            format!(
                "local all all trust\n{host} all all 127.0.0.1/32 trust\n\
                 {host} replication all 127.0.0.1/32 trust\n"
            ),
        )
        .expect("pg_hba.conf");
        let mut settings: Vec<(String, String)> = settings
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        if let Some((pki, which)) = tls {
            install_certificate(&data, pki, which);
            for (name, value) in [
                ("ssl", "on"),
                ("ssl_cert_file", "server.crt"),
                ("ssl_key_file", "server.key"),
            ] {
                settings.push((name.to_owned(), value.to_owned()));
            }
        }
        let mut server = PgServer {
            port: free_port(),
            dir,
            child: None,
            settings,
        };
        server.launch();
        server
    }

    /// A streaming standby of `primary` (`pg_basebackup -R`), started and replaying; it takes
    /// writes once [`promote`](Self::promote)d. `name` is its `application_name`, which
    /// `synchronous_standby_names` on the primary can name.
    pub fn standby_of(primary: &PgServer, name: &str) -> PgServer {
        let dir = new_dir();
        let data = dir.join("data");
        let conninfo = format!(
            "host=127.0.0.1 port={} user=postgres application_name={name}",
            primary.port
        );
        run_to_end(
            Command::new(bin("pg_basebackup"))
                .arg("-D")
                .arg(&data)
                .args(["-d", &conninfo, "-R", "-X", "stream", "--no-sync"]),
            "pg_basebackup",
        );
        let mut standby = PgServer {
            port: free_port(),
            dir,
            child: None,
            settings: primary.settings.clone(),
        };
        standby.launch();
        standby
    }

    fn launch(&mut self) {
        let socket_dir = self.dir.clone();
        let mut command = Command::new(bin("postgres"));
        command
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(&socket_dir)
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(["-c", "max_connections=300", "-c", "max_wal_senders=4"])
            .args(["-c", "wal_level=replica", "-c", "hot_standby=on"])
            .args([
                "-c",
                "log_min_messages=warning",
                "-c",
                "log_line_prefix=%m ",
            ]);
        for (name, value) in &self.settings {
            command.args(["-c", &format!("{name}={value}")]);
        }
        as_postgres(&mut command);
        let child = Child::spawn(command).unwrap_or_else(|e| {
            panic!(
                "cannot run postgres ({e}); install PostgreSQL (`apt-get install postgresql`, \
                 as scripts/test.sh does) or point {PG_BINDIR_ENV} at its binaries"
            )
        });
        match child.wait_for_output(READY_LINE, Instant::now() + START_DEADLINE) {
            Outcome::Found => {}
            other => panic!(
                "postgres on port {} did not start ({other:?}):\n{}",
                self.port,
                tail(&child.output())
            ),
        }
        self.child = Some(child);
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The server's PID (the postmaster's).
    pub fn pid(&self) -> u32 {
        self.child().pid()
    }

    fn child(&self) -> &Arc<Child> {
        self.child.as_ref().expect("the server runs")
    }

    /// Whether the server process is alive.
    pub fn is_running(&self) -> bool {
        self.child.as_ref().is_some_and(|child| child.is_running())
    }

    /// Runs `sql` with `psql` as `postgres`, returning its unaligned, tuples-only output.
    ///
    /// # Panics
    /// When psql fails (with its error).
    pub fn psql(&self, sql: &str) -> String {
        let output = Command::new(bin("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-X", "-A", "-t", "-q"])
            .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .unwrap_or_else(|e| panic!("cannot run psql ({e})"));
        assert!(
            output.status.success(),
            "psql failed on `{sql}`: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Ends every client connection of `user` (`pg_terminate_backend`), as a network cut or a
    /// killed pooler would; answers how many were ended.
    pub fn terminate_connections(&self, user: &str) -> usize {
        let ended = self.psql(&format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE usename = '{user}' AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        ));
        ended.parse().unwrap_or(0)
    }

    /// Cuts a standby off its primary: its `primary_conninfo` emptied and reloaded, it keeps
    /// what it received and replays it, and receives nothing more (as when the network between
    /// them fails). Returns once its WAL receiver has ended.
    ///
    /// # Panics
    /// If the WAL receiver is still running 30 s later (with the log).
    pub fn detach(&self) {
        let child = self.child();
        let mark = child.output_len();
        self.psql("ALTER SYSTEM SET primary_conninfo = ''");
        self.psql("SELECT pg_reload_conf()");
        match child.wait_for_output_after(
            "terminating walreceiver",
            mark,
            Instant::now() + START_DEADLINE,
        ) {
            Outcome::Found => {}
            other => panic!(
                "the standby on port {} kept replicating ({other:?}):\n{}",
                self.port,
                tail(&child.output())
            ),
        }
    }

    /// Makes a standby the primary (`pg_promote`, waiting until it takes writes).
    pub fn promote(&self) {
        assert_eq!(self.psql("SELECT pg_promote(true, 30)"), "t", "promotion");
    }

    /// Stops the server at once, as a crash does: immediate shutdown (`SIGQUIT`), in which
    /// the backends end without a checkpoint and the next start replays the WAL; clients see
    /// their connections drop.
    pub fn kill(&mut self) {
        if let Some(child) = self.child.take() {
            child.signal(libc::SIGQUIT);
            if child.wait_exit(START_DEADLINE).is_none() {
                child.signal(libc::SIGKILL);
                child.wait_exit(KILL_DEADLINE);
            }
        }
    }

    /// Stops the server cleanly (`SIGINT`: fast shutdown, clients disconnected).
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            child.signal(libc::SIGINT);
            child.wait_exit(START_DEADLINE);
        }
    }

    /// Starts the server again on the same port and data (stopping it first if it runs).
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        self.child
            .as_ref()
            .map(|child| child.output())
            .unwrap_or_default()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How PgBouncer hands server connections to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection per client session (`LISTEN` works).
    Session,
    /// A server connection per transaction: a client's statements may run on different server
    /// connections, and session state (`LISTEN`, advisory locks, prepared statements) does not
    /// survive a transaction.
    Transaction,
}

/// PgBouncer in front of a [`PgServer`], on a port of its own; dropping it kills it.
pub struct PgBouncer {
    port: u16,
    dir: PathBuf,
    child: Arc<Child>,
}

impl PgBouncer {
    /// Starts PgBouncer for every database of `server`, in `mode`, trusting every user.
    pub fn start(server: &PgServer, mode: PoolMode) -> PgBouncer {
        let dir = new_dir();
        let port = free_port();
        let mode = match mode {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        };
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").expect("users.txt");
        let ini = format!(
            "[databases]\n* = host=127.0.0.1 port={}\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
             unix_socket_dir = {dir}\nauth_type = trust\nauth_file = {dir}/users.txt\n\
             pool_mode = {mode}\nmax_client_conn = 500\ndefault_pool_size = 20\n\
             ignore_startup_parameters = extra_float_digits,options\n\
             logfile =\n",
            server.port,
            dir = dir.display()
        );
        let config = dir.join("pgbouncer.ini");
        std::fs::write(&config, ini).expect("pgbouncer.ini");
        chown_to_postgres(&dir);
        let program = std::env::var_os(PGBOUNCER_ENV).unwrap_or_else(|| "pgbouncer".into());
        let mut command = Command::new(program);
        command.arg(&config);
        as_postgres(&mut command);
        let child = Child::spawn(command).unwrap_or_else(|e| {
            panic!(
                "cannot run pgbouncer ({e}); install it (`apt-get install pgbouncer`, as \
                 scripts/test.sh does) or point {PGBOUNCER_ENV} at the binary"
            )
        });
        match child.wait_for_output("process up", Instant::now() + START_DEADLINE) {
            Outcome::Found => {}
            other => panic!(
                "pgbouncer did not start ({other:?}):\n{}",
                tail(&child.output())
            ),
        }
        PgBouncer { port, dir, child }
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`, through PgBouncer.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.child.signal(libc::SIGKILL);
        self.child.wait_exit(KILL_DEADLINE);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Copies the server certificate `which` of `pki` into the data dir `data`, as the server
/// wants its key: readable by its owner only, the server's user.
fn install_certificate(data: &Path, pki: &TestPki, which: ServerCert) {
    use std::os::unix::fs::PermissionsExt;
    let (cert, key) = pki.server(which);
    for (from, to) in [(cert, "server.crt"), (key, "server.key")] {
        let to = data.join(to);
        std::fs::copy(&from, &to).unwrap_or_else(|e| panic!("cannot copy {from:?}: {e}"));
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("cannot restrict {to:?}: {e}"));
        chown_to_postgres(&to);
    }
}

/// A temp dir for one server, on `/dev/shm` where there is one, owned by `postgres` when the
/// harness runs as root.
fn new_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    let dir = match shm.is_dir() {
        true => make_temp_dir_in(shm),
        false => make_temp_dir(),
    };
    chown_to_postgres(&dir);
    dir
}

/// Runs `command` (as `postgres` when root) to its end; panics with its output if it fails.
fn run_to_end(command: &mut Command, what: &str) {
    as_postgres(command);
    let output = command.output().unwrap_or_else(|e| {
        panic!(
            "cannot run {what} ({e}); install PostgreSQL (`apt-get install postgresql`, as \
             scripts/test.sh does) or point {PG_BINDIR_ENV} at its binaries"
        )
    });
    assert!(
        output.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A PostgreSQL binary: from [`PG_BINDIR_ENV`], `pg_config --bindir`, or the newest
/// `/usr/lib/postgresql/*/bin`.
fn bin(name: &str) -> PathBuf {
    bindir().join(name)
}

fn bindir() -> PathBuf {
    if let Some(dir) = std::env::var_os(PG_BINDIR_ENV) {
        return PathBuf::from(dir);
    }
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()));
    if let Some(dir) = from_pg_config.filter(|dir| dir.join("postgres").exists()) {
        return dir;
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.path().join("bin"))
                .collect()
        })
        .unwrap_or_default();
    versions.sort_by_key(|dir| {
        dir.parent()
            .and_then(|version| version.file_name())
            .and_then(|version| version.to_str())
            .and_then(|version| version.parse::<u32>().ok())
    });
    versions
        .pop()
        .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/bin"))
}

/// The `postgres` user's uid and gid, when the harness runs as root (PostgreSQL refuses root).
fn postgres_ids() -> Option<(u32, u32)> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = CString::new("postgres").expect("no NUL");
    // SAFETY: getpwnam(3) with a valid C string; the record is read at once, before any other
    // call that could overwrite it (the harness calls it from one place).
    let record = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !record.is_null(),
        "running as root, and there is no `postgres` user to run PostgreSQL as (install \
         PostgreSQL's packages, which create it)"
    );
    // SAFETY: non-null, as checked.
    let record = unsafe { &*record };
    Some((record.pw_uid, record.pw_gid))
}

fn as_postgres(command: &mut Command) {
    if let Some((uid, gid)) = postgres_ids() {
        command.uid(uid).gid(gid).env("HOME", "/tmp");
    }
}

fn chown_to_postgres(dir: &Path) {
    if let Some((uid, gid)) = postgres_ids() {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid))
            .unwrap_or_else(|e| panic!("cannot give {} to postgres: {e}", dir.display()));
    }
}
