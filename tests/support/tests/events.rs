//! `wait_until`: woken by what the server reports, never by a timer.

use std::time::{Duration, Instant};

use distlock_test_support::{wait_until, RedisServer, Reply, Wake};

/// A subscription made after the first check wakes the wait, which returns at once.
#[tokio::test]
async fn a_command_wakes_the_wait() {
    let server = RedisServer::start();
    let mut subscriber = None;
    let mut checks = 0;
    let started = Instant::now();
    let seen = server
        .wait_until(Duration::from_secs(5), async || {
            checks += 1;
            // Counted before the subscriber starts: the first check cannot see it.
            let now = server.subscribers("news");
            if subscriber.is_none() {
                // The event comes after the first check: only it can end the wait in time.
                let addr = server.addr();
                subscriber = Some(std::thread::spawn(move || {
                    use std::io::{Read, Write};
                    let mut socket = std::net::TcpStream::connect(addr).unwrap();
                    socket
                        .write_all(b"*2\r\n$9\r\nSUBSCRIBE\r\n$4\r\nnews\r\n")
                        .unwrap();
                    let mut confirmed = [0u8; 64];
                    let _ = socket.read(&mut confirmed).unwrap();
                    socket
                }));
            }
            now == 1
        })
        .await;
    assert!(seen, "the subscription never woke the wait");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(checks >= 2, "{checks}");
    drop(subscriber.take().unwrap().join().unwrap());
}

/// Nothing happens: the check runs once before waiting and once at the deadline, and its own
/// read-only commands wake nothing.
#[tokio::test]
async fn without_events_the_check_runs_only_at_the_start_and_the_end() {
    let server = RedisServer::start();
    let mut checks = 0;
    let started = Instant::now();
    let seen = server
        .wait_until(Duration::from_millis(300), async || {
            checks += 1;
            server.command(&["GET", "never"]);
            server.subscribers("nobody") == 1
        })
        .await;
    assert!(!seen);
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(checks, 2, "checked between events: polling");
}

/// A key whose TTL runs out changes state without a command: its expiry wakes the wait.
#[tokio::test]
async fn an_expiry_wakes_the_wait() {
    let server = RedisServer::start();
    assert_eq!(
        server.command(&["SET", "brief", "1"]),
        Reply::Simple("OK".into())
    );
    let mut checks = 0;
    let mut present_at_first = false;
    let started = Instant::now();
    let gone = wait_until(
        &[&server],
        Wake::CommandsAndExpiries,
        Duration::from_secs(5),
        async || {
            checks += 1;
            let gone = server.command(&["EXISTS", "brief"]) == Reply::Int(0);
            if checks == 1 {
                present_at_first = !gone;
                // Its TTL starts after the first check: only its expiry can end the wait.
                server.command(&["PEXPIRE", "brief", "200"]);
            }
            gone
        },
    )
    .await;
    assert!(present_at_first, "the key was gone before the wait");
    assert!(gone, "the key never expired");
    assert!(started.elapsed() < Duration::from_secs(5));
    // The PEXPIRE is a command and wakes the wait too: at most one check before the expiry.
    assert!(checks <= 3, "checked between events: {checks}");
}

/// With several servers, an event on any of them wakes the wait.
#[tokio::test]
async fn any_server_wakes_the_wait() {
    let servers = RedisServer::start_many(2);
    let mut checks = 0;
    let started = Instant::now();
    let seen = wait_until(
        &[&servers[0], &servers[1]],
        Wake::Commands,
        Duration::from_secs(5),
        async || {
            checks += 1;
            if checks == 1 {
                servers[1].command(&["SET", "flag", "1"]);
            }
            servers[1].command(&["GET", "flag"]).as_str().as_deref() == Some("1") && checks > 1
        },
    )
    .await;
    assert!(seen);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the second server's event woke no one: ended by the deadline"
    );
    assert_eq!(checks, 2, "woken once, by the SET");
}
