//! The MariaDB harness: a server of its own that keeps what it committed across a crash, ends
//! clients' connections on demand, and takes TLS connections only when started for TLS.

use distlock_test_support::{MariaDbServer, ServerCert, TestPki, MARIADB_BINDIR_ENV};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[test]
fn a_server_of_the_harness_own_survives_a_crash_and_ends_connections() {
    let mut server = MariaDbServer::start();
    assert_ne!(server.port(), 3306, "never the machine's own server");
    assert_eq!(
        server.url(),
        format!("mysql://root@127.0.0.1:{}/test", server.port())
    );
    let plain = finish(tcp_client(&server, &["--skip-ssl", "-e", "SELECT 1"]));
    assert!(
        plain.status.success(),
        "plain TCP from 127.0.0.1: {plain:?}"
    );
    server.sql("CREATE TABLE t (v INT) ENGINE=InnoDB; INSERT INTO t VALUES (1)");
    let pid = server.pid();
    server.kill();
    assert!(!server.is_running());
    server.restart();
    assert_ne!(server.pid(), pid);
    assert_eq!(
        server.sql("SELECT v FROM t"),
        "1",
        "the committed row survives"
    );
    server.sql("INSERT INTO t VALUES (2)");
    server.restart();
    assert_eq!(server.sql("SELECT v FROM t ORDER BY v"), "1\n2");
    server.pause();
    assert!(server.is_running(), "a paused server is alive");
    server.resume();
    assert_eq!(server.sql("SELECT COUNT(*) FROM t"), "2");

    // A client over TCP, as root@127.0.0.1, in a query that would last 30 s.
    let started = Instant::now();
    let client = tcp_client(&server, &["-e", "SELECT SLEEP(30)"]);
    let (exited, exit) = mpsc::channel();
    std::thread::spawn(move || exited.send(client.wait_with_output()));
    // No log line marks a query starting; the processlist does.
    while server
        .sql("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User sleep'")
        == "0"
    {
        if let Ok(output) = exit.try_recv() {
            panic!("the client ended before its query ran: {output:?}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the query never ran"
        );
    }
    assert_eq!(server.kill_connections("root"), 1);
    let output = exit
        .recv_timeout(Duration::from_secs(20))
        .expect("the client ends once its connection is killed")
        .expect("the client's output");
    assert!(!output.status.success(), "{output:?}");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(server.kill_connections("root"), 0);
}

#[test]
fn a_tls_server_takes_tls_connections_only() {
    let pki = TestPki::generate();
    let server = MariaDbServer::start_tls(&pki, ServerCert::Valid);
    assert_eq!(server.sql("SELECT @@require_secure_transport"), "1");
    // Refused as a wrong password is (error 1045), where plain TCP would otherwise do.
    let plain = finish(tcp_client(&server, &["--skip-ssl", "-e", "SELECT 1"]));
    assert!(!plain.status.success(), "{plain:?}");
    let ca = format!("--ssl-ca={}", pki.ca().display());
    let tls = finish(tcp_client(
        &server,
        &[
            "--ssl",
            &ca,
            "--ssl-verify-server-cert",
            "-e",
            "SHOW SESSION STATUS LIKE 'Ssl_version'",
        ],
    ));
    assert!(tls.status.success(), "{tls:?}");
    assert!(
        String::from_utf8_lossy(&tls.stdout).contains("TLS"),
        "{tls:?}"
    );
}

/// `mariadb` as root over TCP to `server`, with `args`, its output captured.
fn tcp_client(server: &MariaDbServer, args: &[&str]) -> std::process::Child {
    let program = std::env::var_os(MARIADB_BINDIR_ENV)
        .map(|dir| PathBuf::from(dir).join("mariadb"))
        .unwrap_or_else(|| PathBuf::from("mariadb"));
    Command::new(program)
        .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root", "-N", "-B"])
        .arg(format!("-P{}", server.port()))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("cannot run mariadb")
}

fn finish(client: std::process::Child) -> Output {
    client.wait_with_output().expect("the client's output")
}
