//! The PostgreSQL fixture: a server of the harness's own with distlock's schema installed (by
//! the SQL `distlock::postgres::schema` prints, as a migration would), and waiting on its
//! events.

use super::{Fixture, PREFIX};
use distlock::{Backend, BackendBuilder};
use distlock_test_support::{PgServer, RedisServer};
use sqlx::postgres::PgListener;
use std::time::{Duration, Instant};

/// The schema the fixture installs and the backends use.
pub const SCHEMA: &str = "distlock";

/// The PostgreSQL backend on a server of its own.
pub struct Postgres {
    pub server: PgServer,
    backend: Backend,
    builder: BackendBuilder,
}

impl Postgres {
    /// A server with the lock schema installed.
    pub fn server() -> PgServer {
        let server = PgServer::start();
        server.psql(&distlock::postgres::schema(SCHEMA).unwrap());
        server
    }
}

impl Fixture for Postgres {
    fn start(configure: impl FnOnce(BackendBuilder) -> BackendBuilder) -> Self {
        let server = Postgres::server();
        let builder = configure(Backend::builder(server.url()).prefix(PREFIX));
        Postgres {
            backend: builder.clone().build().expect("valid settings"),
            builder,
            server,
        }
    }

    fn backend(&self) -> &Backend {
        &self.backend
    }

    /// PostgreSQL keeps no token marker: the sequence a token is taken from never goes back.
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
        let rows = self.server.psql(&format!(
            "SELECT DISTINCT key FROM {SCHEMA}.entries WHERE expires_at > clock_timestamp()"
        ));
        let live: Vec<&str> = rows.lines().collect();
        candidates
            .iter()
            .filter(|key| live.contains(&format!("{PREFIX}:{{{key}}}").as_str()))
            .cloned()
            .collect()
    }

    fn kind(&self) -> &'static str {
        "postgres"
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

    fn postgres(&self) -> Option<&PgServer> {
        Some(&self.server)
    }
}

/// Waits up to `within` until `check` holds, re-checked at every change the schema's channel
/// tells (a join, a renewal, a deletion) and when the next row's time runs out (an expiry is
/// no change in the database: nothing tells it).
pub async fn until_on_postgres(
    server: &PgServer,
    within: Duration,
    mut check: impl AsyncFnMut() -> bool,
) -> bool {
    let deadline = Instant::now() + within;
    let mut listener = PgListener::connect(&server.url()).await.unwrap();
    // Listening before the first check: no change after it is missed.
    listener.listen(SCHEMA).await.unwrap();
    loop {
        if check().await {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let next_expiry = next_expiry(server).unwrap_or(left).min(left);
        match tokio::time::timeout(next_expiry, listener.recv()).await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => panic!("the test's PostgreSQL listener failed: {err}"),
            Err(_) if Instant::now() >= deadline => return check().await,
            Err(_) => {}
        }
    }
}

/// How long until the next live row's time runs out (and a millisecond more).
fn next_expiry(server: &PgServer) -> Option<Duration> {
    let ms = server.psql(&format!(
        "SELECT ceil(extract(epoch FROM min(expires_at) - clock_timestamp()) * 1000)::bigint \
         FROM {SCHEMA}.entries WHERE expires_at > clock_timestamp()"
    ));
    let ms: u64 = ms.parse().ok()?;
    Some(Duration::from_millis(ms + 1))
}
