//! Waiting on what servers report, not on a clock: [`wait_until`] re-evaluates a check each time
//! one of the servers says it did something that can change state — executed a command
//! (`MONITOR` streams every command a server runs, those a script runs included) or, with
//! [`Wake::CommandsAndExpiries`], expired or evicted a key (keyevent notifications) — until the
//! check holds or the time is up.
//!
//! A check is never re-run on a timer: between two events nothing changed on the server but TTLs
//! counting down. What a server does not report is not waited for: a client's connection closing
//! (and its subscriptions with it) is no command, so a wait for that wakes only at the next
//! command anyone sends.

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::resp::{encode_command, parse_reply, Reply};
use crate::server::{RedisServer, COMMAND_TIMEOUT};

/// Commands that change nothing a check can see. Their events wake no one: a check reads the
/// server with them, and would otherwise wake itself. (`CLUSTER`: its subcommands that change
/// anything are administrative, which `MONITOR` never shows; `ROLE` and `CLUSTER SLOTS` are how
/// the harness finds a cluster's masters.)
const READ_ONLY: &[&str] = &[
    "get",
    "mget",
    "strlen",
    "getrange",
    "exists",
    "type",
    "ttl",
    "pttl",
    "keys",
    "scan",
    "dbsize",
    "hget",
    "hgetall",
    "hlen",
    "zcard",
    "zcount",
    "zrange",
    "zrangebyscore",
    "zscore",
    "info",
    "pubsub",
    "ping",
    "echo",
    "time",
    "role",
    "cluster",
];

/// Commands that run a script. They wake no one themselves: `MONITOR` shows every command the
/// script runs right after them (`[0 lua] "set" …`), and those tell a script that writes from one
/// that only reads (`inspect.lua`, which a check may call).
const SCRIPTS: &[&str] = &[
    "eval",
    "evalsha",
    "eval_ro",
    "evalsha_ro",
    "fcall",
    "fcall_ro",
];

/// The keyevent classes [`Wake::CommandsAndExpiries`] adds to `notify-keyspace-events`: `E`
/// keyevent channels, `x` expired, `e` evicted.
const EXPIRY_CLASSES: &str = "Exe";

/// Reads of 16 KiB taken from one stream before its events are looked at.
const MAX_CHUNKS_PER_WAKE: usize = 64;

/// What a [`wait_until`] wakes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Every command the servers execute that can change state (`MONITOR`): writes, scripts and
    /// the commands they run, subscriptions. Read-only commands (`GET`, `PTTL`, `PUBSUB`, `INFO`,
    /// …) are skipped.
    Commands,
    /// Those, and keys expiring or evicted: a key whose TTL runs out changes state without any
    /// command. Adds the keyevent classes `Exe` to the servers' `notify-keyspace-events` (left
    /// on: only subscribers of `__keyevent@*__` channels see them) and subscribes to them.
    CommandsAndExpiries,
}

/// Waits until `check` holds, for at most `within`: checks once, then again each time one of
/// `servers` reports an event of the kind `wake` names; `false` if the time ran out (or every
/// server's event stream ended) with `check` still false. The event streams are open before the
/// first check, so nothing the check misses goes unreported.
///
/// `check` must only read the servers (`GET`, `PTTL`, `EXISTS`, `KEYS`, `INFO`, `PUBSUB`, `ROLE`,
/// `CLUSTER SLOTS`, or a script that runs only such commands, as `Backend::inspect` does), whose
/// events wake no one; a check that writes wakes itself, and would re-run as fast as the server
/// answers.
///
/// # Cancel safety
///
/// Dropped, it stops checking and closes its event connections; a check dropped mid-way is the
/// caller's to answer for.
///
/// # Panics
///
/// If a server does not accept the event connection (or the `MONITOR`, `CONFIG` or `PSUBSCRIBE`
/// on it) within 10 s.
pub async fn wait_until(
    servers: &[&RedisServer],
    wake: Wake,
    within: Duration,
    mut check: impl AsyncFnMut() -> bool,
) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    let mut streams = Vec::with_capacity(servers.len() * 2);
    for server in servers {
        // Subscribed first, so that its own PSUBSCRIBE is not the first event the monitor sees.
        if wake == Wake::CommandsAndExpiries {
            streams.push(EventStream::expiries(server).await);
        }
        streams.push(EventStream::monitor(server).await);
    }
    loop {
        if check().await {
            return true;
        }
        // Events may keep coming; the deadline holds all the same.
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        let woken = poll_fn(|cx| wake_on_any(&mut streams, cx));
        match tokio::time::timeout_at(deadline, woken).await {
            Ok(true) => {}
            // Nothing more can be reported, or the time is up: the last word is the check's.
            Ok(false) | Err(_) => return check().await,
        }
    }
}

impl RedisServer {
    /// [`wait_until`] on this server's commands ([`Wake::Commands`]).
    pub async fn wait_until(&self, within: Duration, check: impl AsyncFnMut() -> bool) -> bool {
        wait_until(&[self], Wake::Commands, within, check).await
    }
}

/// Ready with `true` once one stream reports an event that may have changed state (or ends:
/// the check then sees why), with `false` once every stream has ended.
fn wake_on_any(streams: &mut [EventStream], cx: &mut Context<'_>) -> Poll<bool> {
    let mut live = 0;
    for stream in streams.iter_mut().filter(|stream| !stream.ended) {
        live += 1;
        match stream.poll_event(cx) {
            Poll::Ready(Ok(())) => return Poll::Ready(true),
            Poll::Ready(Err(_)) => {
                stream.ended = true;
                return Poll::Ready(true);
            }
            Poll::Pending => {}
        }
    }
    if live == 0 {
        Poll::Ready(false)
    } else {
        Poll::Pending
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `MONITOR`: one simple string per command executed.
    Monitor,
    /// `PSUBSCRIBE` to keyevent channels: one `pmessage` per key event.
    KeyEvents,
}

/// One connection on which a server pushes events.
struct EventStream {
    kind: Kind,
    socket: TcpStream,
    /// Bytes read and not yet parsed (a partial event).
    received: Vec<u8>,
    ended: bool,
}

impl EventStream {
    /// A `MONITOR` connection, streaming from its `OK` on.
    async fn monitor(server: &RedisServer) -> EventStream {
        let mut stream = EventStream::open(server, Kind::Monitor, &[&["MONITOR"]]).await;
        stream
            .confirmed(server, 1, |reply| *reply == Reply::Simple("OK".into()))
            .await;
        stream
    }

    /// A connection subscribed to `server`'s expiries and evictions, which it enables first.
    async fn expiries(server: &RedisServer) -> EventStream {
        let setting = server.command(&["CONFIG", "GET", "notify-keyspace-events"]);
        let current = setting
            .as_array()
            .and_then(|pair| pair.get(1))
            .and_then(Reply::as_str)
            .unwrap_or_else(|| panic!("CONFIG GET notify-keyspace-events: {setting:?}"));
        let classes = format!("{current}{EXPIRY_CLASSES}");
        let set = server.command(&["CONFIG", "SET", "notify-keyspace-events", &classes]);
        assert_eq!(
            set,
            Reply::Simple("OK".into()),
            "CONFIG SET notify-keyspace-events"
        );
        let mut stream = EventStream::open(
            server,
            Kind::KeyEvents,
            &[&[
                "PSUBSCRIBE",
                "__keyevent@*__:expired",
                "__keyevent@*__:evicted",
            ]],
        )
        .await;
        stream
            .confirmed(server, 2, |reply| {
                matches!(reply.as_array(), Some([kind, ..]) if kind.as_str().as_deref() == Some("psubscribe"))
            })
            .await;
        stream
    }

    async fn open(server: &RedisServer, kind: Kind, commands: &[&[&str]]) -> EventStream {
        let addr: SocketAddr = server.addr();
        let connect = async {
            let mut socket = TcpStream::connect(addr).await?;
            socket.set_nodelay(true)?;
            for args in commands {
                let args: Vec<&[u8]> = args.iter().map(|arg| arg.as_bytes()).collect();
                socket.write_all(&encode_command(&args)).await?;
            }
            io::Result::Ok(socket)
        };
        let socket = match tokio::time::timeout(COMMAND_TIMEOUT, connect).await {
            Ok(Ok(socket)) => socket,
            Ok(Err(e)) => panic!(
                "redis-server on port {}: event connection: {e}",
                server.port()
            ),
            Err(_) => panic!(
                "redis-server on port {}: event connection not open within {COMMAND_TIMEOUT:?}",
                server.port()
            ),
        };
        EventStream {
            kind,
            socket,
            received: Vec::new(),
            ended: false,
        }
    }

    /// Reads the `n` replies that confirm the stream is in force, each passing `confirms`.
    async fn confirmed(
        &mut self,
        server: &RedisServer,
        n: usize,
        confirms: impl Fn(&Reply) -> bool,
    ) {
        for _ in 0..n {
            let reply = tokio::time::timeout(COMMAND_TIMEOUT, self.next_reply())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "redis-server on port {}: no {:?} confirmation within {COMMAND_TIMEOUT:?}",
                        server.port(),
                        self.kind
                    )
                })
                .unwrap_or_else(|e| {
                    panic!(
                        "redis-server on port {}: event connection: {e}",
                        server.port()
                    )
                });
            assert!(
                confirms(&reply),
                "redis-server on port {}: {:?} answered {reply:?}",
                server.port(),
                self.kind
            );
        }
    }

    async fn next_reply(&mut self) -> io::Result<Reply> {
        loop {
            if let Some(reply) = self.parse_one()? {
                return Ok(reply);
            }
            poll_fn(|cx| self.poll_fill(cx)).await?;
        }
    }

    fn parse_one(&mut self) -> io::Result<Option<Reply>> {
        match parse_reply(&self.received) {
            Ok(Some((reply, used))) => {
                self.received.drain(..used);
                Ok(Some(reply))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(io::Error::new(io::ErrorKind::InvalidData, e)),
        }
    }

    /// Reads what the socket has: ready once at least one byte came.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut chunk = [0u8; 16 * 1024];
        let mut buf = ReadBuf::new(&mut chunk);
        match Pin::new(&mut self.socket).poll_read(cx, &mut buf) {
            Poll::Ready(Ok(())) if buf.filled().is_empty() => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the event connection",
            ))),
            Poll::Ready(Ok(())) => {
                self.received.extend_from_slice(buf.filled());
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Ready once an event that may change state arrived; consumes every event already received,
    /// so that a burst wakes one check, not one per event.
    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // What the socket holds now (bounded, for a server that never stops talking), then every
        // complete event in it.
        let mut registered = false;
        for _ in 0..MAX_CHUNKS_PER_WAKE {
            match self.poll_fill(cx) {
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    registered = true;
                    break;
                }
            }
        }
        // Parsed in place and drained once: draining each event would move the rest of a
        // burst (up to a MiB of `MONITOR` lines) once per event.
        let mut woken = false;
        let mut parsed = 0;
        loop {
            match parse_reply(&self.received[parsed..]) {
                Ok(Some((event, used))) => {
                    parsed += used;
                    woken |= self.wakes(&event);
                }
                Ok(None) => break,
                Err(e) => return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e))),
            }
        }
        self.received.drain(..parsed);
        if woken {
            Poll::Ready(Ok(()))
        } else {
            if !registered {
                // More is waiting to be read: come back for it after the others had their turn.
                cx.waker().wake_by_ref();
            }
            Poll::Pending
        }
    }

    fn wakes(&self, event: &Reply) -> bool {
        match self.kind {
            Kind::Monitor => match event {
                // `<time> [<db> <client>] "<command>" "<arg>" …`
                Reply::Simple(line) => line
                    .split_once("] \"")
                    .and_then(|(_, command)| command.split('"').next())
                    .is_none_or(|command| {
                        !READ_ONLY
                            .iter()
                            .chain(SCRIPTS)
                            .any(|quiet| quiet.eq_ignore_ascii_case(command))
                    }),
                _ => true,
            },
            Kind::KeyEvents => matches!(
                event.as_array(),
                Some([kind, ..]) if kind.as_str().as_deref() == Some("pmessage")
            ),
        }
    }
}
