//! Picking loopback ports for servers started by the harness.
//!
//! Asking the kernel for an ephemeral port (bind to port 0) is the only way to
//! find one that is free right now, but the answer is only a hint: the port is
//! released before `redis-server` binds it, so another process may take it in
//! between. [`crate::RedisServer`] therefore also retries on "Address already in
//! use". Within one process we can do better and never hand out a port twice,
//! which matters because tests in one binary run on parallel threads and a
//! stopped server keeps its port for a later `restart`.

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{LazyLock, Mutex, PoisonError};

/// The port of a Redis that may already be running on the machine; the harness
/// must never start a server there (nor talk to one there).
const DEFAULT_REDIS_PORT: u16 = 6379;

/// Gives up after this many kernel answers that were all unusable, which would
/// mean the ephemeral range is exhausted.
const MAX_ATTEMPTS: usize = 1000;

static HANDED_OUT: LazyLock<Mutex<HashSet<u16>>> = LazyLock::new(Mutex::default);

/// A currently free TCP port on 127.0.0.1, never 6379 and never one this
/// process has been given before.
///
/// # Panics
///
/// If the kernel refuses to bind loopback sockets or keeps answering with
/// ports already handed out.
pub fn free_port() -> u16 {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    for _ in 0..MAX_ATTEMPTS {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("cannot bind an ephemeral port on 127.0.0.1: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("cannot read the address of a bound socket: {e}"))
            .port();
        if port != DEFAULT_REDIS_PORT && handed_out.insert(port) {
            return port;
        }
    }
    panic!("no unused loopback port after {MAX_ATTEMPTS} attempts");
}
