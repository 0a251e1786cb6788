//! The fault proxy between a plain socket client and a real redis-server.
//!
//! The proxy runs on its own thread, so these tests may use blocking
//! sockets even inside `#[tokio::test]`.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use distlock_test_support::{
    command_at, encode_command, parse_reply, FaultProxy, RedisServer, Reply,
};

const TIMEOUT: Duration = Duration::from_secs(5);

fn pong() -> Reply {
    Reply::Simple("PONG".into())
}

/// A persistent connection for tests that need one across several steps.
struct Conn(TcpStream);

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
        Conn(stream)
    }

    fn send(&mut self, args: &[&str]) {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.0.write_all(&encode_command(&args)).unwrap();
    }

    /// Reads one reply; the I/O error if none comes within the read timeout.
    fn read(&mut self) -> std::io::Result<Reply> {
        let mut received = Vec::new();
        let mut chunk = [0u8; 1024];
        loop {
            if let Some((reply, used)) = parse_reply(&received).unwrap() {
                assert_eq!(used, received.len(), "more than one reply arrived");
                return Ok(reply);
            }
            match self.0.read(&mut chunk)? {
                0 => return Err(ErrorKind::UnexpectedEof.into()),
                n => received.extend_from_slice(&chunk[..n]),
            }
        }
    }

    fn call(&mut self, args: &[&str]) -> Reply {
        self.send(args);
        self.read().unwrap()
    }

    /// Sends `args` on a connection that must be dead; the error it meets.
    fn call_err(&mut self, args: &[&str]) -> std::io::Error {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        if let Err(err) = self.0.write_all(&encode_command(&args)) {
            return err;
        }
        self.read().expect_err("the connection was reset")
    }
}

fn is_connection_loss(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::ConnectionReset | ErrorKind::UnexpectedEof | ErrorKind::BrokenPipe
    )
}

#[tokio::test]
async fn forwards_and_counts() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    assert_eq!(
        proxy.url(),
        format!("redis://127.0.0.1:{}", proxy.addr().port())
    );

    let mut conn = Conn::open(proxy.addr());
    // Two commands in one write still count as two.
    conn.0
        .write_all(&[encode_command(&[b"PING"]), encode_command(&[b"PING"])].concat())
        .unwrap();
    let mut replies = Vec::new();
    while replies.len() < 14 {
        let mut chunk = [0u8; 64];
        let n = conn.0.read(&mut chunk).unwrap();
        replies.extend_from_slice(&chunk[..n]);
    }
    assert_eq!(replies, b"+PONG\r\n+PONG\r\n");
    assert_eq!(proxy.commands_seen(), 2);
    assert_eq!(proxy.connections(), 1);

    assert_eq!(
        command_at(proxy.addr(), &["SET", "k", "v"], TIMEOUT).unwrap(),
        Reply::Simple("OK".into())
    );
    assert_eq!(server.command(&["GET", "k"]).as_str().as_deref(), Some("v"));
    assert_eq!(proxy.commands_seen(), 3);
}

#[tokio::test]
async fn drop_next_reply_loses_exactly_one_and_resets() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let mut bystander = Conn::open(proxy.addr());
    assert_eq!(bystander.call(&["PING"]), pong());

    proxy.drop_next_reply();
    let lost = command_at(proxy.addr(), &["SET", "k", "v"], TIMEOUT).unwrap_err();
    assert!(is_connection_loss(&lost), "{lost}");
    assert_eq!(proxy.dropped().await, 1);
    // The server did execute the command whose reply was lost.
    assert_eq!(server.command(&["GET", "k"]).as_str().as_deref(), Some("v"));
    // Only that one reply and that one connection were affected.
    assert_eq!(
        command_at(proxy.addr(), &["PING"], TIMEOUT).unwrap(),
        pong()
    );
    assert_eq!(bystander.call(&["PING"]), pong());
    assert_eq!(proxy.drops(), 1);
}

#[tokio::test]
async fn matching_drop_without_reset_skips_one_frame() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let mut conn = Conn::open(proxy.addr());
    proxy.drop_next_reply_matching(b"secret", false);
    conn.send(&["ECHO", "secret"]);
    conn.send(&["ECHO", "public"]);
    assert_eq!(proxy.wait_drops(1).await, 1);
    assert_eq!(conn.read().unwrap().as_str().as_deref(), Some("public"));
    assert_eq!(
        conn.call(&["ECHO", "secret"]).as_str().as_deref(),
        Some("secret")
    );
}

#[tokio::test]
async fn a_reply_can_be_delivered_and_its_connection_reset_right_after() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let mut bystander = Conn::open(proxy.addr());
    let mut conn = Conn::open(proxy.addr());
    proxy.reset_after_reply_matching(b"last-words");
    assert_eq!(
        conn.call(&["ECHO", "last-words"]).as_str().as_deref(),
        Some("last-words"),
        "the reply itself arrives"
    );
    assert_eq!(proxy.dropped().await, 1);
    let after = conn.call_err(&["PING"]);
    assert!(is_connection_loss(&after), "{after}");
    assert_eq!(
        bystander.call(&["PING"]),
        pong(),
        "other connections live on"
    );
}

#[tokio::test]
async fn blackhole_holds_traffic_until_lifted() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let mut conn = Conn::open(proxy.addr());
    assert_eq!(conn.call(&["PING"]), pong());

    proxy.blackhole(true);
    conn.send(&["SET", "k", "held"]);
    conn.0
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let held = conn.read().unwrap_err();
    assert!(
        matches!(held.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{held}"
    );
    assert!(
        server.command(&["GET", "k"]).is_nil(),
        "the command reached the server"
    );
    assert_eq!(proxy.requests_held(), 1, "the proxy holds the request");

    conn.0.set_read_timeout(Some(TIMEOUT)).unwrap();
    proxy.blackhole(false);
    assert_eq!(conn.read().unwrap(), Reply::Simple("OK".into()));
    assert_eq!(proxy.requests_held(), 0);
    assert_eq!(
        server.command(&["GET", "k"]).as_str().as_deref(),
        Some("held")
    );
}

#[tokio::test]
async fn reset_all_and_refuse_cut_connections() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let mut conn = Conn::open(proxy.addr());
    assert_eq!(conn.call(&["PING"]), pong());

    proxy.reset_all();
    assert_eq!(proxy.connections(), 0);
    let cut = conn.read().unwrap_err();
    assert!(is_connection_loss(&cut), "{cut}");
    assert_eq!(
        command_at(proxy.addr(), &["PING"], TIMEOUT).unwrap(),
        pong()
    );

    proxy.refuse(true);
    let refused = command_at(proxy.addr(), &["PING"], TIMEOUT).unwrap_err();
    assert!(is_connection_loss(&refused), "{refused}");
    proxy.refuse(false);
    assert_eq!(
        command_at(proxy.addr(), &["PING"], TIMEOUT).unwrap(),
        pong()
    );
}

#[tokio::test]
async fn delay_applies_in_both_directions() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let mut conn = Conn::open(proxy.addr());
    assert_eq!(conn.call(&["PING"]), pong());

    proxy.set_delay(Duration::from_millis(100));
    let started = Instant::now();
    assert_eq!(conn.call(&["PING"]), pong());
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "{:?}",
        started.elapsed()
    );

    // Lifting a delay releases what is already waiting it out.
    proxy.set_delay(Duration::from_secs(60));
    conn.send(&["PING"]);
    proxy.set_delay(Duration::ZERO);
    assert_eq!(conn.read().unwrap(), pong());
}

#[test]
fn harness_types_can_live_in_statics() {
    fn shareable<T: Send + Sync + 'static>() {}
    shareable::<FaultProxy>();
    shareable::<RedisServer>();
}

#[tokio::test]
async fn dropping_the_proxy_closes_everything() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let addr = proxy.addr();
    let mut conn = Conn::open(addr);
    assert_eq!(conn.call(&["PING"]), pong());
    drop(proxy);
    let closed = conn.read().unwrap_err();
    assert!(is_connection_loss(&closed), "{closed}");
    assert!(TcpStream::connect(addr).is_err());
}

#[tokio::test]
async fn upstream_restart_is_seen_by_new_connections() {
    let mut server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    server.kill();
    let down = command_at(proxy.addr(), &["PING"], TIMEOUT).unwrap_err();
    assert!(is_connection_loss(&down), "{down}");
    server.restart();
    assert_eq!(
        command_at(proxy.addr(), &["PING"], TIMEOUT).unwrap(),
        pong()
    );
}
