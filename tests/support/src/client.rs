//! A one-shot blocking Redis client: connect, send commands, read their
//! replies, hang up. A fresh connection per call keeps tests independent of
//! any connection state (selected DB, MULTI, subscriptions) and is cheap on
//! loopback.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::resp::{encode_command, parse_reply, Reply};

/// Sends `args` as one command to the server at `addr` and returns its reply.
///
/// `timeout` bounds the whole exchange (connect, write and every read), so a
/// paused or black-holed server shows up as an [`io::ErrorKind::WouldBlock`] or
/// [`io::ErrorKind::TimedOut`] error instead of a hang. An error *reply* from
/// Redis is not an I/O error: it comes back as [`Reply::Error`].
///
/// # Errors
///
/// Connect, read and write errors as they occur; `TimedOut`/`WouldBlock` when
/// the reply does not arrive in time; `UnexpectedEof` when the server closes
/// first; `InvalidData` when it answers with something that is not RESP.
pub fn command_at(addr: SocketAddr, args: &[&str], timeout: Duration) -> io::Result<Reply> {
    let mut replies = pipeline_at(addr, &[args], timeout)?;
    Ok(replies.remove(0))
}

/// Sends several commands on one connection (pipelined) and returns their
/// replies in order. Needed where a command depends on its connection's
/// earlier ones, e.g. `WAIT` after a write, or `MULTI` … `EXEC`.
///
/// `timeout` bounds the whole exchange, as for [`command_at`].
///
/// # Errors
///
/// As for [`command_at`].
pub fn pipeline_at(
    addr: SocketAddr,
    commands: &[&[&str]],
    timeout: Duration,
) -> io::Result<Vec<Reply>> {
    let deadline = Instant::now() + timeout;
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(timeout))?;
    let mut request = Vec::new();
    for args in commands {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        request.extend_from_slice(&encode_command(&args));
    }
    stream.write_all(&request)?;

    let mut replies = Vec::with_capacity(commands.len());
    let mut received = Vec::new();
    let mut chunk = [0u8; 4096];
    while replies.len() < commands.len() {
        match parse_reply(&received) {
            Ok(Some((reply, used))) => {
                replies.push(reply);
                received.drain(..used);
                continue;
            }
            Ok(None) => {}
            Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
        }
        let left = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "no complete reply in time"))?;
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut chunk)? {
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed before a complete reply",
                ))
            }
            n => received.extend_from_slice(&chunk[..n]),
        }
    }
    Ok(replies)
}
