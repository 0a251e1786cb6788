//! Forwarding one client connection to the upstream server, applying the
//! faults currently switched on.
//!
//! Each direction is a reader and a writer joined by a small channel. The
//! reader stamps every chunk with its arrival time and keeps reading, so a
//! delay is added latency, not reduced throughput; the writer holds each
//! chunk until its due time and while the blackhole is on. Replies are cut
//! into whole RESP frames before they are written, which is what lets the
//! proxy lose exactly one reply.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::faults::{DropMode, Faults, Framing, Ticket};
use crate::resp::try_frame_len;

const READ_SIZE: usize = 16 * 1024;
/// Chunks buffered between reader and writer; beyond that the reader stops
/// and TCP flow control holds the rest, so a blackhole never drops data.
const CHUNKS_IN_FLIGHT: usize = 64;

/// Why a connection ended other than by both sides closing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Abort {
    /// A read or write failed.
    Io,
    /// A reply was swallowed and the connection must now be reset.
    DroppedReply,
    /// `reset_all` was called.
    Reset,
}

/// Proxies `client` to `upstream` until either side closes or a fault ends it.
pub(super) async fn serve(
    mut client: TcpStream,
    upstream: SocketAddr,
    faults: Arc<Faults>,
    ticket: Ticket,
) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        // Nothing to forward to: reset the client, as a dead server would.
        let _ = client.set_zero_linger();
        return;
    };
    // Commands are tiny and latency is what the tests measure.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);

    let abort = {
        let (from_client, to_client) = client.split();
        let (from_server, to_server) = server.split();
        tokio::select! {
            ended = async {
                tokio::try_join!(
                    forward(from_client, to_server, &faults, RequestCounter::default()),
                    forward(from_server, to_client, &faults, ReplyFilter::default()),
                )
            } => ended.err(),
            () = ticket.reset() => Some(Abort::Reset),
        }
    };
    if let Some(abort) = abort {
        // SO_LINGER 0 turns the close into a RST: the peers see "connection
        // reset", as after a network failure, not an orderly EOF.
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
        drop((client, server, ticket));
        if abort == Abort::DroppedReply {
            faults.record_drop();
        }
    }
}

/// A chunk read from one side, waiting to be written to the other.
struct Chunk {
    arrived: Instant,
    bytes: Vec<u8>,
}

/// What a [`Filter`] lets through for one chunk.
struct Pass {
    bytes: Vec<u8>,
    /// Complete client commands in `bytes`, counted once they are written.
    commands: usize,
    /// Reset the connection after writing `bytes`.
    reset: bool,
}

/// Per-direction treatment of the byte stream.
trait Filter {
    /// `true` for the client → server direction, whose held chunks are counted.
    const REQUESTS: bool = false;
    fn filter(&mut self, chunk: Vec<u8>, faults: &Faults) -> Pass;
    /// Bytes still held when the sender closes.
    fn finish(&mut self) -> Vec<u8>;
}

/// Client → server: forwards chunks untouched, only counting commands.
#[derive(Default)]
struct RequestCounter {
    /// The incomplete command at the end of what was seen so far.
    partial: Vec<u8>,
    /// Set on input that is not RESP; counting stops rather than guessing.
    lost: bool,
}

impl Filter for RequestCounter {
    const REQUESTS: bool = true;

    fn filter(&mut self, chunk: Vec<u8>, faults: &Faults) -> Pass {
        let mut commands = 0;
        if !self.lost {
            self.partial.extend_from_slice(&chunk);
            let mut start = 0;
            loop {
                match request_len(faults.framing, &self.partial[start..]) {
                    Ok(Some(len)) => {
                        start += len;
                        commands += 1;
                    }
                    Ok(None) => break,
                    Err(()) => {
                        self.lost = true;
                        break;
                    }
                }
            }
            self.partial.drain(..start);
        }
        Pass {
            bytes: chunk,
            commands,
            reset: false,
        }
    }

    fn finish(&mut self) -> Vec<u8> {
        Vec::new()
    }
}

/// Length of the first client command: a RESP array or, as Redis also
/// accepts, an inline command terminated by a newline; or one packet.
fn request_len(framing: Framing, buf: &[u8]) -> Result<Option<usize>, ()> {
    if framing == Framing::LengthPrefixed {
        return packet_len(buf).map_err(drop);
    }
    match buf.first() {
        None => Ok(None),
        Some(b'*') => try_frame_len(buf).map_err(drop),
        Some(_) => Ok(buf.iter().position(|&b| b == b'\n').map(|i| i + 1)),
    }
}

/// Length of the first reply in `buf`, cut as `framing` cuts it (`None`: incomplete).
fn reply_len(framing: Framing, buf: &[u8]) -> Result<Option<usize>, String> {
    match framing {
        Framing::Resp => try_frame_len(buf).map_err(|e| e.to_string()),
        Framing::LengthPrefixed => packet_len(buf),
    }
}

/// Length of the first length-prefixed packet in `buf`, prefix included.
fn packet_len(buf: &[u8]) -> Result<Option<usize>, String> {
    let Some(prefix) = buf.get(..4) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes(prefix.try_into().expect("four bytes")) as usize;
    if len > 64 << 20 {
        return Err(format!("a packet of {len} bytes"));
    }
    Ok((buf.len() >= 4 + len).then_some(4 + len))
}

/// Server → client: forwards whole frames only, swallowing those an armed
/// drop rule claims.
#[derive(Default)]
struct ReplyFilter {
    /// Bytes of a frame that is not complete yet.
    pending: Vec<u8>,
    /// Set on input that is not RESP: from then on bytes pass unframed
    /// rather than being held forever.
    unframed: bool,
}

impl Filter for ReplyFilter {
    fn filter(&mut self, chunk: Vec<u8>, faults: &Faults) -> Pass {
        if self.unframed {
            return Pass {
                bytes: chunk,
                commands: 0,
                reset: false,
            };
        }
        self.pending.extend_from_slice(&chunk);
        let mut out = Vec::with_capacity(self.pending.len());
        let mut start = 0;
        let mut reset = false;
        while start < self.pending.len() {
            match reply_len(faults.framing, &self.pending[start..]) {
                Ok(Some(len)) => {
                    let frame = &self.pending[start..start + len];
                    start += len;
                    match faults.claim_drop(frame) {
                        None => out.extend_from_slice(frame),
                        Some(DropMode::Silent) => faults.record_drop(),
                        Some(DropMode::Reset) => {
                            // Whatever followed the lost reply dies with the connection.
                            start = self.pending.len();
                            reset = true;
                            break;
                        }
                        Some(DropMode::DeliverThenReset) => {
                            out.extend_from_slice(frame);
                            start = self.pending.len();
                            reset = true;
                            break;
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    eprintln!(
                        "fault proxy: server sent data it cannot frame ({e}); forwarding it unframed"
                    );
                    self.unframed = true;
                    out.extend_from_slice(&self.pending[start..]);
                    start = self.pending.len();
                }
            }
        }
        self.pending.drain(..start);
        Pass {
            bytes: out,
            commands: 0,
            reset,
        }
    }

    fn finish(&mut self) -> Vec<u8> {
        // The server closed mid-frame; pass on the truncated frame as it is.
        std::mem::take(&mut self.pending)
    }
}

/// Waits until `arrived` plus the current delay, re-reading the delay when it
/// changes so that turning it off releases chunks already waiting.
async fn hold_until_due(arrived: Instant, delay: &mut watch::Receiver<Duration>) {
    loop {
        let due = arrived + *delay.borrow_and_update();
        if due <= Instant::now() {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep_until(due) => return,
            changed = delay.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

/// Copies `from` to `to` through `filter` under the current faults. Ends
/// with `Ok` once `from` has closed and everything is written (then `to` is
/// half-closed, mirroring the sender's FIN).
async fn forward<R, W, F>(
    mut from: R,
    mut to: W,
    faults: &Faults,
    mut filter: F,
) -> Result<(), Abort>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    F: Filter,
{
    let (chunks, mut inbox) = mpsc::channel::<Chunk>(CHUNKS_IN_FLIGHT);
    // Chunks read but not written when the connection ends are lost with it.
    let held = HeldChunks {
        faults,
        count: F::REQUESTS,
        chunks: AtomicIsize::new(0),
    };
    let held = &held;
    let read = async move {
        let mut buf = vec![0u8; READ_SIZE];
        loop {
            let n = from.read(&mut buf).await.map_err(|_| Abort::Io)?;
            let chunk = Chunk {
                arrived: Instant::now(),
                bytes: buf[..n].to_vec(),
            };
            if n > 0 {
                held.add(1);
            }
            // Dropping the sender on EOF is how the writer learns of it.
            if n == 0 || chunks.send(chunk).await.is_err() {
                return Ok(());
            }
        }
    };
    let write = async {
        let mut blackhole = faults.watch_blackhole();
        let mut delay = faults.watch_delay();
        while let Some(chunk) = inbox.recv().await {
            hold_until_due(chunk.arrived, &mut delay).await;
            // Err only if the proxy is being torn down.
            let _ = blackhole.wait_for(|&on| !on).await;
            let pass = filter.filter(chunk.bytes, faults);
            to.write_all(&pass.bytes).await.map_err(|_| Abort::Io)?;
            held.add(-1);
            faults.add_commands(pass.commands);
            if pass.reset {
                return Err(Abort::DroppedReply);
            }
        }
        to.write_all(&filter.finish())
            .await
            .map_err(|_| Abort::Io)?;
        to.shutdown().await.map_err(|_| Abort::Io)
    };
    tokio::try_join!(read, write).map(|_| ())
}

/// Counts the client chunks one connection holds, in [`Faults`]; gives the count back when the
/// connection ends.
struct HeldChunks<'a> {
    faults: &'a Faults,
    count: bool,
    chunks: AtomicIsize,
}

impl HeldChunks<'_> {
    fn add(&self, delta: isize) {
        if self.count {
            self.chunks.fetch_add(delta, Ordering::SeqCst);
            self.faults.request_held(delta);
        }
    }
}

impl Drop for HeldChunks<'_> {
    fn drop(&mut self) {
        let chunks = *self.chunks.get_mut();
        if self.count && chunks != 0 {
            self.faults.request_held(-chunks);
        }
    }
}
