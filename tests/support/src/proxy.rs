//! A fault-injecting TCP proxy between a client under test and one Redis
//! server, for partition, latency and lost-reply tests.
//!
//! The proxy runs on its own thread with its own current-thread tokio
//! runtime. That keeps it forwarding even while the test's runtime is busy
//! or blocked (a blocking call inside `#[tokio::test]`, a synchronous
//! [`FaultProxy::reset_all`]), and it makes shutdown deterministic: dropping
//! the runtime drops every connection task, so when `Drop` returns every
//! socket is closed.

mod connection;
mod faults;

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

pub use faults::Framing;
use faults::{DropMode, Faults};

/// Upper bound for the proxy's own waits ([`FaultProxy::wait_drops`],
/// [`FaultProxy::reset_all`]): a test that gets here is broken, and a panic
/// says so sooner than a CI timeout.
const WAIT_DEADLINE: Duration = Duration::from_secs(10);

/// A TCP proxy on `127.0.0.1:<free port>` forwarding to one upstream
/// address, with switchable faults.
///
/// Dropping it stops accepting and closes all its connections.
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: Arc<std::sync::Mutex<SocketAddr>>,
    faults: Arc<Faults>,
    runtime: Handle,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream)
            .field("faults", &self.faults)
            .finish_non_exhaustive()
    }
}

impl FaultProxy {
    /// Starts a proxy to `upstream`, listening on a fresh loopback port.
    ///
    /// It is `async` to fit async tests, but works from any runtime (or none
    /// being polled): the proxy brings its own.
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound or the proxy thread cannot start.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        FaultProxy::start_framed(upstream, Framing::Resp).await
    }

    /// Starts a proxy to `upstream` whose protocol cuts its streams as `framing` does (what a
    /// lost reply is: ZooKeeper's packets are [`Framing::LengthPrefixed`]).
    ///
    /// # Panics
    ///
    /// As [`FaultProxy::start`].
    pub async fn start_framed(upstream: SocketAddr, framing: Framing) -> FaultProxy {
        // Binding port 0 directly (rather than via free_port) leaves no window
        // in which another process could take the port.
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("fault proxy: cannot bind a loopback port: {e}"));
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("fault proxy: cannot make the listener non-blocking: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("fault proxy: cannot read the listening address: {e}"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("fault proxy: cannot build its runtime: {e}"));
        let handle = runtime.handle().clone();
        let faults = Arc::new(Faults::new(framing));
        let upstream = Arc::new(std::sync::Mutex::new(upstream));
        let (shutdown, stopped) = oneshot::channel::<()>();
        let thread = thread::Builder::new()
            .name(format!("fault-proxy-{}", addr.port()))
            .spawn({
                let faults = Arc::clone(&faults);
                let upstream = Arc::clone(&upstream);
                move || {
                    runtime.block_on(async move {
                        let listener = TcpListener::from_std(listener).unwrap_or_else(|e| {
                            panic!("fault proxy: cannot register the listener: {e}")
                        });
                        tokio::select! {
                            () = accept_loop(listener, upstream, faults) => {}
                            _ = stopped => {}
                        }
                    });
                    // Dropping the runtime here drops every connection task and
                    // with it every socket, before FaultProxy::drop returns.
                    drop(runtime);
                }
            })
            .unwrap_or_else(|e| panic!("fault proxy: cannot start its thread: {e}"));
        FaultProxy {
            addr,
            upstream,
            faults,
            runtime: handle,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:<port>` of the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.addr.port())
    }

    /// The server the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        *self.upstream.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forwards every connection accepted from now on to `upstream`, and closes the ones open
    /// (as [`reset_all`](Self::reset_all)): a virtual IP moved to a new primary.
    pub fn retarget(&self, upstream: SocketAddr) {
        *self.upstream.lock().unwrap_or_else(|e| e.into_inner()) = upstream;
        self.reset_all();
    }

    /// Delays every forwarded chunk, in both directions, by `delay` after it
    /// arrived at the proxy (so a round trip gains about twice `delay`). A
    /// change applies to chunks already waiting too; [`Duration::ZERO`] turns
    /// the delay off.
    pub fn set_delay(&self, delay: Duration) {
        self.faults.set_delay(delay);
    }

    /// Loses the next complete reply from the server, on whichever
    /// connection it comes, then resets that connection both ways: the
    /// server has executed the command but the client never hears back,
    /// which is how a lost reply looks on TCP. RESP3 push frames are not
    /// replies and pass; in RESP2 a pub/sub message is an ordinary array and
    /// does count, so aim with [`FaultProxy::drop_next_reply_matching`] on
    /// subscribed connections. Returns at once; see [`FaultProxy::dropped`].
    ///
    /// Arm it before sending the command whose reply should be lost.
    pub fn drop_next_reply(&self) {
        self.faults.arm_drop(None, DropMode::Reset);
    }

    /// Loses the next server frame (reply or push) whose bytes contain
    /// `needle`. With `reset` the connection is then reset as in
    /// [`FaultProxy::drop_next_reply`]; without, the frame just vanishes and
    /// the connection carries on (e.g. one lost pub/sub message).
    pub fn drop_next_reply_matching(&self, needle: &[u8], reset: bool) {
        let mode = if reset {
            DropMode::Reset
        } else {
            DropMode::Silent
        };
        self.faults.arm_drop(Some(needle), mode);
    }

    /// Delivers the next server frame whose bytes contain `needle`, then
    /// resets that connection: the client has its answer and loses the
    /// connection right after (e.g. a SUBSCRIBE confirmed on a link that
    /// dies at once). Counted in [`FaultProxy::dropped`] once the reset is
    /// done.
    pub fn reset_after_reply_matching(&self, needle: &[u8]) {
        self.faults
            .arm_drop(Some(needle), DropMode::DeliverThenReset);
    }

    /// Waits until every drop armed so far has happened; returns how many
    /// replies have been dropped since the proxy started.
    ///
    /// # Panics
    ///
    /// If that takes more than 10 s.
    pub async fn dropped(&self) -> usize {
        self.wait_drops(self.faults.armed()).await
    }

    /// Waits until at least `n` replies have been dropped since the proxy
    /// started, and returns the count. When a drop with reset is counted,
    /// the connection has already been reset.
    ///
    /// # Panics
    ///
    /// If that takes more than 10 s.
    pub async fn wait_drops(&self, n: usize) -> usize {
        let mut drops = self.faults.watch_drops();
        // The timer runs on the proxy's runtime, so the caller's runtime need
        // not have its time driver enabled.
        let waited = self.runtime.spawn(async move {
            match tokio::time::timeout(WAIT_DEADLINE, drops.wait_for(|&d| d >= n)).await {
                Ok(Ok(count)) => Some(*count),
                _ => None,
            }
        });
        match waited.await {
            Ok(Some(count)) => count,
            _ => panic!(
                "fault proxy: waited {WAIT_DEADLINE:?} for {n} dropped replies, saw {}",
                self.drops()
            ),
        }
    }

    /// Replies dropped since the proxy started.
    pub fn drops(&self) -> usize {
        self.faults.drops()
    }

    /// While on, bytes in both directions are held: not forwarded, not
    /// discarded. Connections stay open (new ones are accepted) and
    /// everything held flows again, in order, once it is turned off: a
    /// network partition that heals.
    pub fn blackhole(&self, on: bool) {
        self.faults.set_blackhole(on);
    }

    /// Resets every open connection (RST to both client and server) and
    /// returns once they are all closed. Connections made afterwards work.
    ///
    /// # Panics
    ///
    /// If the connections are not gone within 10 s.
    pub fn reset_all(&self) {
        assert!(
            self.faults.reset_all(WAIT_DEADLINE),
            "fault proxy: connections still open {WAIT_DEADLINE:?} after reset_all"
        );
    }

    /// While on, new connections are accepted and immediately reset, as when
    /// a server is down. Open connections are not affected.
    pub fn refuse(&self, on: bool) {
        self.faults.set_refuse(on);
    }

    /// Client connections currently open through the proxy.
    pub fn connections(&self) -> usize {
        self.faults.open_connections()
    }

    /// Chunks of client requests the proxy has read but not (yet) written to
    /// the server: held by a delay or the blackhole. A reset loses them.
    pub fn requests_held(&self) -> usize {
        self.faults.requests_held()
    }

    /// Waits until at least `n` client request chunks are held ([`FaultProxy::requests_held`]),
    /// for at most `limit`: `false` if they never were. Woken by each change of the count, never
    /// by a timer.
    ///
    /// # Cancel safety
    /// Dropped, the caller stops waiting; the watch on the proxy's runtime ends by `limit`.
    pub async fn until_requests_held(&self, n: usize, limit: Duration) -> bool {
        let mut held = self.faults.watch_requests_held();
        // The timer runs on the proxy's runtime, so the caller's runtime need not have its time
        // driver enabled.
        let waited = self.runtime.spawn(async move {
            matches!(
                tokio::time::timeout(limit, held.wait_for(|&count| count >= n)).await,
                Ok(Ok(_))
            )
        });
        waited.await.unwrap_or(false)
    }

    /// [`FaultProxy::until_requests_held`] for a caller outside any runtime: blocks the thread.
    ///
    /// # Panics
    ///
    /// When called from inside a runtime.
    pub fn wait_requests_held(&self, n: usize, limit: Duration) -> bool {
        self.runtime.block_on(self.until_requests_held(n, limit))
    }

    /// Complete client commands forwarded to the server since the proxy
    /// started, e.g. to count round trips.
    pub fn commands_seen(&self) -> usize {
        self.faults.commands()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            // Never panic in drop; a proxy thread panic was already printed.
            let _ = thread.join();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: Arc<std::sync::Mutex<SocketAddr>>,
    faults: Arc<Faults>,
) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(e) => {
                // Typically EMFILE. A short pause keeps a persistent error
                // from spinning the proxy thread.
                eprintln!("fault proxy: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if faults.refusing() {
            let _ = client.set_zero_linger();
            continue;
        }
        let ticket = faults.open_connection();
        let upstream = *upstream.lock().unwrap_or_else(|e| e.into_inner());
        tokio::spawn(connection::serve(
            client,
            upstream,
            Arc::clone(&faults),
            ticket,
        ));
    }
}
