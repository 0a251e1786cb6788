//! Picking loopback ports for servers started by the harness.
//!
//! Asking the kernel for an ephemeral port (bind to port 0) is the only way to
//! find one that is free right now, but the answer is only a hint: the port is
//! released before `redis-server` binds it, so another process may take it in
//! between. [`crate::RedisServer`] therefore also retries on "Address already in
//! use". Within one process we can do better and never hand out a port twice,
//! which matters because tests in one binary run on parallel threads and a
//! stopped server keeps its port for a later `restart`.
//!
//! A Redis Cluster node also listens on its cluster bus port, its client port
//! plus 10000; [`free_cluster_port`] finds a port for which both are free.

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{LazyLock, Mutex, PoisonError};

/// The port of a Redis that may already be running on the machine; the harness
/// must never start a server there (nor talk to one there).
const DEFAULT_REDIS_PORT: u16 = 6379;

/// A cluster node's bus port is its client port plus this (Redis's default,
/// `cluster-port 0`).
pub(crate) const CLUSTER_BUS_PORT_OFFSET: u16 = 10_000;

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
        let (_listener, port) = ephemeral();
        if port != DEFAULT_REDIS_PORT && handed_out.insert(port) {
            return port;
        }
    }
    panic!("no unused loopback port after {MAX_ATTEMPTS} attempts");
}

/// A currently free TCP port on 127.0.0.1 whose cluster bus port (the port
/// plus 10000) is free too, for a Redis Cluster node. Like [`free_port`], it
/// is never 6379 (nor is its bus port), and neither port has been handed out
/// by this process before, nor will be again: [`free_port`] never returns
/// the bus port.
///
/// Both ports are bound at the same time while checking, but released before
/// returning, so `redis-server` may still find either taken;
/// [`crate::RedisServer`] then retries with another pair. With the usual
/// Linux ephemeral range (32768–60999) about four in five kernel answers
/// leave room for the bus port below 65536.
///
/// # Panics
///
/// As for [`free_port`].
pub fn free_cluster_port() -> u16 {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    for _ in 0..MAX_ATTEMPTS {
        // Held while the bus port is tried, so the kernel cannot answer with
        // the same port twice in a row.
        let (_listener, port) = ephemeral();
        let Some(bus) = port.checked_add(CLUSTER_BUS_PORT_OFFSET) else {
            continue;
        };
        let usable = |p: u16| p != DEFAULT_REDIS_PORT && !handed_out.contains(&p);
        if !(usable(port) && usable(bus)) {
            continue;
        }
        if TcpListener::bind((Ipv4Addr::LOCALHOST, bus)).is_ok() {
            handed_out.insert(port);
            handed_out.insert(bus);
            return port;
        }
    }
    panic!("no loopback port with a free cluster bus port after {MAX_ATTEMPTS} attempts");
}

/// A socket bound to a port the kernel chose on 127.0.0.1, and that port; the port is free
/// again once the socket is dropped.
fn ephemeral() -> (TcpListener, u16) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap_or_else(|e| panic!("cannot bind an ephemeral port on 127.0.0.1: {e}"));
    let port = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("cannot read the address of a bound socket: {e}"))
        .port();
    (listener, port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ports_leave_their_bus_port_to_no_one_else() {
        let ports: Vec<u16> = (0..50).map(|_| free_cluster_port()).collect();
        let buses: HashSet<u16> = ports.iter().map(|p| p + CLUSTER_BUS_PORT_OFFSET).collect();
        assert!(!ports.contains(&DEFAULT_REDIS_PORT) && !buses.contains(&DEFAULT_REDIS_PORT));
        assert_eq!(ports.iter().collect::<HashSet<_>>().len(), ports.len());
        // Neither a later free_port nor a later cluster port is a bus port.
        for _ in 0..200 {
            assert!(!buses.contains(&free_port()));
        }
        for _ in 0..50 {
            let port = free_cluster_port();
            assert!(!buses.contains(&port) && !ports.contains(&(port + CLUSTER_BUS_PORT_OFFSET)));
        }
    }
}
