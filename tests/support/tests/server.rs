//! The redis-server harness against real processes.

use std::io::ErrorKind;
use std::net::TcpStream;
use std::time::Duration;

use distlock_test_support::{free_port, RedisServer, Reply, ServerConfig};

fn ok() -> Reply {
    Reply::Simple("OK".into())
}

#[test]
fn serves_commands() {
    let server = RedisServer::start();
    assert_eq!(server.command(&["PING"]), Reply::Simple("PONG".into()));
    assert_eq!(server.command(&["SET", "k", "v"]), ok());
    assert_eq!(server.command(&["GET", "k"]).as_str().as_deref(), Some("v"));
    assert!(server.command(&["GET", "missing"]).is_nil());
    assert_eq!(server.command(&["INCR", "n"]), Reply::Int(1));
    assert!(server.command(&["NO-SUCH-COMMAND"]).as_error().is_some());
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert_eq!(server.addr().port(), server.port());
    assert!(server.log().contains("Ready to accept connections"));
}

#[test]
fn config_args_are_applied() {
    let server =
        RedisServer::start_with(ServerConfig::new().arg("maxmemory-policy", "allkeys-lru"));
    let reply = server.command(&["CONFIG", "GET", "maxmemory-policy"]);
    let values: Vec<_> = reply
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(values, ["maxmemory-policy", "allkeys-lru"]);
    // The harness's own defaults: no persistence, private dir.
    let dir = server.command(&["CONFIG", "GET", "dir"]);
    assert_eq!(
        dir.as_array().unwrap()[1].as_str().unwrap(),
        server.dir().to_str().unwrap()
    );
}

#[test]
fn restart_keeps_port_and_dir() {
    let mut server = RedisServer::start();
    let (port, dir, pid) = (server.port(), server.dir().to_owned(), server.pid());
    server.command(&["SET", "k", "v"]);
    server.restart();
    assert_eq!((server.port(), server.dir()), (port, dir.as_path()));
    assert_ne!(server.pid(), pid);
    assert!(server.is_running());
    // Persistence is off, so a restart loses data, like a crash would.
    assert!(server.command(&["GET", "k"]).is_nil());
    assert_eq!(
        server.log().matches("Ready to accept connections").count(),
        2
    );
}

#[test]
fn kill_and_stop_end_the_process() {
    let mut killed = RedisServer::start();
    killed.kill();
    assert!(!killed.is_running());
    let refused = killed
        .try_command(&["PING"], Duration::from_secs(1))
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);
    killed.kill(); // idempotent
    killed.restart();
    assert_eq!(killed.command(&["PING"]), Reply::Simple("PONG".into()));

    let mut stopped = RedisServer::start();
    stopped.stop();
    assert!(!stopped.is_running());
    assert!(stopped.log().contains("ready to exit"), "{}", stopped.log());
}

#[test]
fn pause_stalls_and_resume_continues() {
    let mut server = RedisServer::start();
    server.pause();
    assert!(server.is_running());
    let stalled = server
        .try_command(&["PING"], Duration::from_millis(200))
        .unwrap_err();
    assert!(
        matches!(stalled.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{stalled}"
    );
    server.resume();
    assert_eq!(server.command(&["PING"]), Reply::Simple("PONG".into()));
    // Stopping a paused server must not wait out the SIGTERM grace period.
    server.pause();
    server.stop();
    assert!(!server.is_running());
}

#[test]
fn replica_follows_its_master() {
    let master = RedisServer::start();
    let replica = RedisServer::start_with(ServerConfig::new().replica_of(master.port()));
    replica.wait_for_replica_sync();
    // WAIT counts acks for its own connection's writes, hence one pipeline.
    let replies = master.pipeline(&[&["SET", "k", "v"], &["WAIT", "1", "5000"]]);
    assert_eq!(replies, [ok(), Reply::Int(1)]);
    assert_eq!(
        replica.command(&["GET", "k"]).as_str().as_deref(),
        Some("v")
    );
}

#[test]
fn start_many_gives_independent_servers() {
    let servers = RedisServer::start_many(3);
    let mut ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3);
    servers[0].command(&["SET", "k", "0"]);
    assert!(servers[1].command(&["GET", "k"]).is_nil());
}

#[test]
fn drop_kills_the_process_and_removes_its_dir() {
    let server = RedisServer::start();
    let (addr, dir) = (server.addr(), server.dir().to_owned());
    assert!(dir.is_dir());
    drop(server);
    assert!(!dir.exists());
    assert!(TcpStream::connect(addr).is_err());
}

#[test]
fn free_ports_are_unique_and_never_the_default() {
    let mut ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
    assert!(!ports.contains(&6379));
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 200);
}

#[test]
#[should_panic(expected = "FATAL CONFIG FILE ERROR")]
fn a_bad_config_fails_with_the_log() {
    RedisServer::start_with(ServerConfig::new().arg("maxmemory-policy", "no-such-policy"));
}
