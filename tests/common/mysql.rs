//! The MySQL fixture: a MariaDB server of the harness's own with distlock's schema installed (by
//! the SQL `distlock::mysql::schema` prints, through the `mariadb` client, as a migration
//! would).

use super::{Fixture, PREFIX};
use distlock::{Backend, BackendBuilder};
use distlock_test_support::{MariaDbServer, RedisServer};
use std::time::{Duration, Instant};

/// The lock database the fixture installs and the backends use.
pub const SCHEMA: &str = "distlock";

/// The MySQL backend on a MariaDB server of its own.
pub struct Mysql {
    pub server: MariaDbServer,
    backend: Backend,
    builder: BackendBuilder,
}

impl Mysql {
    /// A server with the lock schema installed.
    pub fn server() -> MariaDbServer {
        let server = MariaDbServer::start();
        server.sql(&distlock::mysql::schema(SCHEMA).unwrap());
        server
    }
}

impl Fixture for Mysql {
    fn start(configure: impl FnOnce(BackendBuilder) -> BackendBuilder) -> Self {
        let server = Mysql::server();
        let builder = configure(Backend::builder(server.url()).prefix(PREFIX));
        Mysql {
            backend: builder.clone().build().expect("valid settings"),
            builder,
            server,
        }
    }

    fn backend(&self) -> &Backend {
        &self.backend
    }

    /// MySQL keeps no token marker: AUTO_INCREMENT never goes back.
    async fn forget_token_marker(&self, _key: &str) {}

    /// The time left of the holder's lease row, on the database's clock.
    async fn pttl(&self, key: &str) -> Option<Duration> {
        let holder = self.backend.inspect(key).await.unwrap()?;
        Some(holder.ttl)
    }

    fn contender(&self) -> Backend {
        self.builder.clone().build().unwrap()
    }

    /// Keys among `candidates` with a live row left: a holder, or a waiter, which would hold
    /// up everyone behind it.
    async fn held_keys(&self, candidates: &[String]) -> Vec<String> {
        let rows = self.server.sql(&format!(
            "SELECT DISTINCT CAST(lock_key AS CHAR) FROM {SCHEMA}.entries \
             WHERE expires_at > UTC_TIMESTAMP(6)"
        ));
        let live: Vec<&str> = rows.lines().collect();
        candidates
            .iter()
            .filter(|key| live.contains(&format!("{PREFIX}:{{{key}}}").as_str()))
            .cloned()
            .collect()
    }

    fn kind(&self) -> &'static str {
        "mysql"
    }

    fn servers(&self) -> Vec<&RedisServer> {
        Vec::new()
    }

    fn least_token(&self) -> u64 {
        1
    }

    fn grants_in_a_row(&self) -> usize {
        2_000
    }

    fn mysql(&self) -> Option<&MariaDbServer> {
        Some(&self.server)
    }
}

/// Waits up to `within` until `check` holds, re-checked at every change of local state the
/// runtime's test hooks report (every actor of a conformance test is in this process) and when
/// the next row's time runs out (an expiry is no change in the database: nothing tells it, and
/// MySQL tells no change to another connection anyway).
pub async fn until_on_mysql(
    server: &MariaDbServer,
    within: Duration,
    mut check: impl AsyncFnMut() -> bool,
) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let step = next_expiry(server).unwrap_or(left).min(left);
        if distlock::__private::raw::until_local(step, &mut check).await {
            return true;
        }
        if Instant::now() >= deadline {
            return check().await;
        }
    }
}

/// How long until the next live row's time runs out (and a millisecond more).
fn next_expiry(server: &MariaDbServer) -> Option<Duration> {
    let ms = server.sql(&format!(
        "SELECT CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MIN(expires_at)) / 1000) \
         FROM {SCHEMA}.entries WHERE expires_at > UTC_TIMESTAMP(6)"
    ));
    let ms: u64 = ms.parse().ok()?;
    Some(Duration::from_millis(ms + 1))
}
