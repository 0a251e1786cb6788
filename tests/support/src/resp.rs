//! A hand-written RESP codec: just enough to talk to `redis-server` and to
//! find frame boundaries in a byte stream, without depending on the `redis`
//! crate whose behaviour the tests are meant to check.
//!
//! Two readers share the same grammar:
//!
//! * [`frame_len`] / [`try_frame_len`] only measure a frame (no allocation);
//!   the fault proxy calls them on every chunk it forwards.
//! * [`parse_reply`] builds a [`Reply`]. RESP3 values are folded into the
//!   RESP2 shapes the same way Redis itself downgrades them for RESP2 clients
//!   (map → flat array, set/push → array, null → nil bulk, boolean → integer,
//!   double/big number/verbatim string → bulk string), so tests only ever see
//!   the five RESP2 variants.

use std::fmt;

/// Deepest aggregate nesting accepted. Real replies nest a handful of levels;
/// the cap only keeps a garbage stream from overflowing the stack.
const MAX_DEPTH: usize = 256;

/// One decoded Redis reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// Simple string, e.g. `+OK`.
    Simple(String),
    /// Error reply, e.g. `-ERR unknown command`, without the leading `-`.
    Error(String),
    /// Integer reply, e.g. `:1`.
    Int(i64),
    /// Bulk string; `None` is the nil bulk `$-1`.
    Bulk(Option<Vec<u8>>),
    /// Array; `None` is the nil array `*-1`.
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The integer value: an [`Reply::Int`], or a simple/bulk string holding
    /// a decimal integer (as `GET` returns for a counter).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            Reply::Simple(s) => s.parse().ok(),
            Reply::Bulk(Some(b)) => std::str::from_utf8(b).ok()?.parse().ok(),
            _ => None,
        }
    }

    /// The text of a simple string or of a UTF-8 bulk string. Errors are
    /// deliberately excluded (see [`Reply::as_error`]) so that an error can
    /// never be mistaken for a value.
    pub fn as_str(&self) -> Option<String> {
        match self {
            Reply::Simple(s) => Some(s.clone()),
            Reply::Bulk(Some(b)) => String::from_utf8(b.clone()).ok(),
            _ => None,
        }
    }

    /// The raw bytes of a non-nil bulk string.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(Some(b)) => Some(b),
            _ => None,
        }
    }

    /// The elements of a non-nil array.
    pub fn as_array(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(Some(items)) => Some(items),
            _ => None,
        }
    }

    /// The message of an error reply.
    pub fn as_error(&self) -> Option<&str> {
        match self {
            Reply::Error(e) => Some(e),
            _ => None,
        }
    }

    /// True for the nil bulk string and the nil array.
    pub fn is_nil(&self) -> bool {
        matches!(self, Reply::Bulk(None) | Reply::Array(None))
    }
}

/// The byte stream is not RESP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError {
    /// Offset of the offending byte from the start of the buffer.
    pub offset: usize,
    /// What was wrong there.
    pub reason: &'static str,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed RESP at byte {}: {}", self.offset, self.reason)
    }
}

impl std::error::Error for FrameError {}

/// Incremental frame splitter: the length in bytes of the first complete
/// RESP2/RESP3 frame at the start of `buf`, or `None` while it is incomplete.
///
/// Malformed input also yields `None`; use [`try_frame_len`] to tell the two
/// apart. A RESP3 attribute (`|`) is counted together with the value it
/// annotates, since the two are only meaningful as one reply.
pub fn frame_len(buf: &[u8]) -> Option<usize> {
    try_frame_len(buf).ok().flatten()
}

/// Like [`frame_len`], but reports malformed input instead of waiting for
/// more bytes that could never make it valid.
///
/// # Errors
///
/// [`FrameError`] when `buf` does not start with a valid RESP frame (or a
/// prefix of one).
pub fn try_frame_len(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    let mut cursor = Cursor { buf, pos: 0 };
    finish(cursor.skip(0).map(|()| cursor.pos))
}

/// Decodes the first complete reply in `buf`: the reply and the number of
/// bytes it used, or `None` while the buffer holds only part of it.
///
/// # Errors
///
/// [`FrameError`] when `buf` does not start with a valid RESP frame (or a
/// prefix of one).
pub fn parse_reply(buf: &[u8]) -> Result<Option<(Reply, usize)>, FrameError> {
    let mut cursor = Cursor { buf, pos: 0 };
    finish(cursor.parse(0).map(|reply| (reply, cursor.pos)))
}

/// Encodes a command as a RESP array of bulk strings, the form Redis expects
/// from clients.
pub fn encode_command(args: &[&[u8]]) -> Vec<u8> {
    let payload: usize = args.iter().map(|a| a.len() + 16).sum();
    let mut out = Vec::with_capacity(payload + 16);
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Why a read stopped before producing a value.
enum Stop {
    /// More bytes are needed; the input so far is a valid prefix.
    Incomplete,
    Malformed(FrameError),
}

fn finish<T>(result: Result<T, Stop>) -> Result<Option<T>, FrameError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(Stop::Incomplete) => Ok(None),
        Err(Stop::Malformed(e)) => Err(e),
    }
}

/// A read position in a buffer that may end in the middle of a frame.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn malformed(&self, offset: usize, reason: &'static str) -> Stop {
        Stop::Malformed(FrameError { offset, reason })
    }

    /// The bytes up to the next CRLF, consuming the CRLF.
    fn line(&mut self) -> Result<&'a [u8], Stop> {
        let rest = &self.buf[self.pos..];
        let cr = rest
            .iter()
            .position(|&b| b == b'\r')
            .ok_or(Stop::Incomplete)?;
        match rest.get(cr + 1) {
            None => Err(Stop::Incomplete),
            Some(b'\n') => {
                self.pos += cr + 2;
                Ok(&rest[..cr])
            }
            Some(_) => Err(self.malformed(self.pos + cr + 1, "CR not followed by LF")),
        }
    }

    fn int_line(&mut self) -> Result<i64, Stop> {
        let start = self.pos;
        let line = self.line()?;
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| self.malformed(start, "expected a decimal integer"))
    }

    /// A length header; `Ok(None)` for the nil length `-1` where `nil_ok`.
    fn length(&mut self, nil_ok: bool) -> Result<Option<usize>, Stop> {
        let start = self.pos;
        match self.int_line()? {
            -1 if nil_ok => Ok(None),
            n => usize::try_from(n)
                .map(Some)
                .map_err(|_| self.malformed(start, "negative length")),
        }
    }

    /// `len` payload bytes followed by CRLF.
    fn payload(&mut self, len: usize) -> Result<&'a [u8], Stop> {
        let end = self.pos.checked_add(len).ok_or(Stop::Incomplete)?;
        if self.buf.len() < end + 2 {
            return Err(Stop::Incomplete);
        }
        if &self.buf[end..end + 2] != b"\r\n" {
            return Err(self.malformed(end, "payload not terminated by CRLF"));
        }
        let data = &self.buf[self.pos..end];
        self.pos = end + 2;
        Ok(data)
    }

    fn type_byte(&mut self, depth: usize) -> Result<u8, Stop> {
        if depth > MAX_DEPTH {
            return Err(self.malformed(self.pos, "nesting too deep"));
        }
        let byte = *self.buf.get(self.pos).ok_or(Stop::Incomplete)?;
        self.pos += 1;
        Ok(byte)
    }

    /// Steps over one value without building it.
    fn skip(&mut self, depth: usize) -> Result<(), Stop> {
        let at = self.pos;
        match self.type_byte(depth)? {
            b'+' | b'-' | b':' | b'_' | b'#' | b',' | b'(' => {
                self.line()?;
            }
            kind @ (b'$' | b'!' | b'=') => {
                if let Some(len) = self.length(kind == b'$')? {
                    self.payload(len)?;
                }
            }
            kind @ (b'*' | b'~' | b'>') => {
                for _ in 0..self.length(kind == b'*')?.unwrap_or(0) {
                    self.skip(depth + 1)?;
                }
            }
            b'%' => {
                for _ in 0..self.count()? {
                    self.skip(depth + 1)?;
                    self.skip(depth + 1)?;
                }
            }
            b'|' => {
                for _ in 0..self.count()? {
                    self.skip(depth + 1)?;
                    self.skip(depth + 1)?;
                }
                self.skip(depth)?;
            }
            _ => return Err(self.malformed(at, "unknown RESP type byte")),
        }
        Ok(())
    }

    /// A length or count header of a type that has no nil form.
    fn count(&mut self) -> Result<usize, Stop> {
        Ok(self.length(false)?.unwrap_or(0))
    }

    /// Reads one value, folding RESP3 types into their RESP2 equivalents.
    fn parse(&mut self, depth: usize) -> Result<Reply, Stop> {
        let at = self.pos;
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        Ok(match self.type_byte(depth)? {
            b'+' => Reply::Simple(text(self.line()?)),
            b'-' => Reply::Error(text(self.line()?)),
            b':' => Reply::Int(self.int_line()?),
            b'_' => {
                self.line()?;
                Reply::Bulk(None)
            }
            b'#' => match self.line()? {
                b"t" => Reply::Int(1),
                b"f" => Reply::Int(0),
                _ => return Err(self.malformed(at + 1, "boolean must be t or f")),
            },
            b',' | b'(' => Reply::Bulk(Some(self.line()?.to_vec())),
            b'$' => match self.length(true)? {
                None => Reply::Bulk(None),
                Some(len) => Reply::Bulk(Some(self.payload(len)?.to_vec())),
            },
            b'!' => {
                let len = self.count()?;
                Reply::Error(text(self.payload(len)?))
            }
            b'=' => {
                // Verbatim strings carry a three-letter format and a colon
                // ("txt:"), which RESP2 clients never see.
                let len = self.count()?;
                let body = self.payload(len)?;
                match body.get(3) {
                    Some(b':') => Reply::Bulk(Some(body[4..].to_vec())),
                    _ => return Err(self.malformed(at, "verbatim string without format")),
                }
            }
            kind @ (b'*' | b'~' | b'>') => match self.length(kind == b'*')? {
                None => Reply::Array(None),
                Some(n) => {
                    // Cap the preallocation: the count is untrusted input.
                    let mut items = Vec::with_capacity(n.min(1024));
                    for _ in 0..n {
                        items.push(self.parse(depth + 1)?);
                    }
                    Reply::Array(Some(items))
                }
            },
            b'%' => {
                let n = self.count()?;
                let mut items = Vec::with_capacity(n.min(512) * 2);
                for _ in 0..n * 2 {
                    items.push(self.parse(depth + 1)?);
                }
                Reply::Array(Some(items))
            }
            b'|' => {
                // Attributes are out-of-band metadata; the reply is the value after them.
                for _ in 0..self.count()? {
                    self.skip(depth + 1)?;
                    self.skip(depth + 1)?;
                }
                self.parse(depth)?
            }
            _ => return Err(self.malformed(at, "unknown RESP type byte")),
        })
    }
}
