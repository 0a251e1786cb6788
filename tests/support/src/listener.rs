//! A raw subscriber that records what a channel carries: [`ChannelListener`].

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::resp::{encode_command, parse_reply, Reply};

/// A connection subscribed to one channel (`SUBSCRIBE`, confirmed before [`listen`] returns),
/// which collects the messages published on it. [`messages`](Self::messages) sends a `PING` and
/// reads up to its reply: a server answers a connection in order, so every message published
/// before the `PING` arrived is read, and the count cannot depend on timing.
///
/// [`listen`]: ChannelListener::listen
pub struct ChannelListener {
    stream: TcpStream,
    received: Vec<u8>,
}

impl ChannelListener {
    /// Subscribes to `channel` on the server at `addr`.
    ///
    /// # Panics
    /// When the server cannot be reached or does not confirm the subscription within `timeout`.
    pub fn listen(addr: SocketAddr, channel: &str, timeout: Duration) -> ChannelListener {
        let stream = TcpStream::connect_timeout(&addr, timeout).expect("connect to listen");
        stream.set_read_timeout(Some(timeout)).unwrap();
        stream.set_write_timeout(Some(timeout)).unwrap();
        let mut listener = ChannelListener {
            stream,
            received: Vec::new(),
        };
        listener.send(&[b"SUBSCRIBE", channel.as_bytes()]);
        let confirmation = listener.next_reply().expect("SUBSCRIBE confirmation");
        assert_eq!(
            confirmation
                .as_array()
                .and_then(|parts| parts[0].as_str())
                .as_deref(),
            Some("subscribe"),
            "{confirmation:?}"
        );
        listener
    }

    /// The payloads of the messages published on the channel since the last call.
    ///
    /// # Panics
    /// When the server does not answer the `PING` within the timeout.
    pub fn messages(&mut self) -> Vec<Vec<u8>> {
        self.send(&[b"PING"]);
        let mut messages = Vec::new();
        loop {
            let reply = self.next_reply().expect("PING reply");
            let parts = reply.as_array().unwrap_or_default();
            match parts.first().and_then(Reply::as_str).as_deref() {
                Some("pong") => return messages,
                Some("message") => messages.push(parts[2].as_bytes().unwrap().to_vec()),
                _ => panic!("unexpected frame on a subscribed connection: {reply:?}"),
            }
        }
    }

    fn send(&mut self, args: &[&[u8]]) {
        self.stream.write_all(&encode_command(args)).unwrap();
    }

    fn next_reply(&mut self) -> io::Result<Reply> {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some((reply, used)) = parse_reply(&self.received)
                .map_err(|err| io::Error::new(io::ErrorKind::InvalidData, format!("{err:?}")))?
            {
                self.received.drain(..used);
                return Ok(reply);
            }
            let read = self.stream.read(&mut chunk)?;
            if read == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.received.extend_from_slice(&chunk[..read]);
        }
    }
}
