//! A primary found through Redis Sentinel and followed across failovers.
//!
//! The sentinels are asked which server is the group's primary (redis-rs's [`SentinelClient`],
//! which also checks with `ROLE` that the server it names is one) whenever a [`Node`] needs a
//! connection: on first use, after a connection to the old primary failed or the old primary
//! answered `READONLY` (it was demoted), and after a sentinel announced `+switch-master` for the
//! group. The announcements arrive on a pub/sub connection to one sentinel, held by a
//! background task for as long as the target lives.
//!
//! [`Node`]: super::node::Node

use super::alive::AliveFlag;
use super::tls;
use crate::engines::settings::Timeouts;
use crate::engines::settings::TlsFiles;
use crate::error::LockError;
use crate::hooks::{self, SharedHooks};
use crate::util::hosts::{percent_decode, split_scheme, Authority};
use crate::util::redact::redact_url;
use futures_util::StreamExt;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::IntoConnectionInfo;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// The port sentinels listen on when a URL names none.
pub(crate) const SENTINEL_PORT: u16 = 26379;
/// The channel on which sentinels announce a new primary.
const SWITCH_MASTER: &str = "+switch-master";
/// The longest pause between attempts to reach a sentinel for announcements.
const MAX_LISTEN_RETRY: Duration = Duration::from_secs(1);

/// A `redis-sentinel://` URL, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SentinelSpec {
    pub(crate) sentinels: Vec<(String, u16)>,
    /// `rediss-sentinel://`: TLS to the sentinels and to the servers they name.
    pub(crate) secure: bool,
    pub(crate) master_name: String,
    pub(crate) db: i64,
    /// Credentials of the primary (the URL's user info).
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    /// Credentials of the sentinels (`sentinel_username` / `sentinel_password` in the query).
    pub(crate) sentinel_username: Option<String>,
    pub(crate) sentinel_password: Option<String>,
}

impl SentinelSpec {
    /// Parses `redis[s]-sentinel://[user:password@]host[:port][,host[:port]…]/MASTER_NAME[?db=N]`
    /// (also `sentinel_username=…&sentinel_password=…` in the query, for sentinels that require
    /// their own credentials); the error says what is wrong, with the password redacted.
    pub(crate) fn parse(url: &str) -> Result<SentinelSpec, LockError> {
        let problem = |what: String| {
            LockError::invalid_config(
                "url",
                format!(
                    "`{}` {what}; expected redis[s]-sentinel://[user:password@]host:port[,host:port…]/MASTER_NAME[?db=N]",
                    redact_url(url)
                ),
            )
        };
        let (rest, secure) = split_scheme(url, "redis-sentinel", "rediss-sentinel")
            .ok_or_else(|| problem("is not a redis-sentinel:// URL".into()))?
            .map_err(problem)?;
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = rest
            .split_once('/')
            .ok_or_else(|| problem("names no master (the path after the sentinels)".into()))?;
        let Authority {
            username,
            password,
            hosts: sentinels,
        } = Authority::parse(authority, SENTINEL_PORT, "sentinel", &problem)?;
        let path = path.trim_end_matches('/');
        let master_name = Some(path)
            .filter(|path| !path.contains('/'))
            .and_then(percent_decode)
            .filter(|name| !name.is_empty())
            .ok_or_else(|| problem("names no master (the path after the sentinels)".into()))?;
        let mut spec = SentinelSpec {
            sentinels,
            secure,
            master_name,
            db: 0,
            username,
            password,
            sentinel_username: None,
            sentinel_password: None,
        };
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value)
                .ok_or_else(|| problem(format!("holds a malformed percent-escape in `{name}`")))?;
            match name {
                "db" => {
                    spec.db = value.parse().map_err(|_| {
                        problem(format!("gives `db={value}`; a database is a number"))
                    })?
                }
                "sentinel_username" => spec.sentinel_username = Some(value),
                "sentinel_password" => spec.sentinel_password = Some(value),
                other => {
                    return Err(problem(format!(
                        "has the unknown setting `{other}` (known: db, sentinel_username, \
                         sentinel_password)"
                    )))
                }
            }
        }
        Ok(spec)
    }

    fn client(&self, tls: &TlsFiles) -> redis::RedisResult<SentinelClient> {
        let addrs = self
            .sentinels
            .iter()
            .map(|(host, port)| tls::address(host.clone(), *port, self.secure));
        let mut builder =
            SentinelClientBuilder::new(addrs, &self.master_name, SentinelServerType::Master)?
                .set_client_to_redis_db(self.db);
        if self.secure {
            builder = tls::secure_sentinels(builder, tls);
        }
        if let Some(user) = &self.username {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(pass) = &self.password {
            builder = builder.set_client_to_redis_password(pass);
        }
        if let Some(user) = &self.sentinel_username {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(pass) = &self.sentinel_password {
            builder = builder.set_client_to_sentinel_password(pass);
        }
        builder.build()
    }

    /// A client for the primary at `host:port`, with the primary's credentials and database.
    fn primary_client(
        &self,
        host: String,
        port: u16,
        tls: &TlsFiles,
    ) -> redis::RedisResult<redis::Client> {
        let mut info = redis::RedisConnectionInfo::default().set_db(self.db);
        if let Some(user) = &self.username {
            info = info.set_username(user);
        }
        if let Some(pass) = &self.password {
            info = info.set_password(pass);
        }
        let addr = tls::address(host, port, self.secure);
        tls::client_for(addr.into_connection_info()?.set_redis_settings(info), tls)
    }

    /// A client for sentinel `index` (modulo their number), with the sentinels' credentials.
    fn sentinel_client(&self, index: usize, tls: &TlsFiles) -> redis::RedisResult<redis::Client> {
        let (host, port) = &self.sentinels[index % self.sentinels.len()];
        let mut info = redis::RedisConnectionInfo::default();
        if let Some(user) = &self.sentinel_username {
            info = info.set_username(user);
        }
        if let Some(pass) = &self.sentinel_password {
            info = info.set_password(pass);
        }
        let addr = tls::address(host.clone(), *port, self.secure);
        tls::client_for(addr.into_connection_info()?.set_redis_settings(info), tls)
    }

    /// `master NAME via sentinels host:port,…`, for messages.
    pub(crate) fn describe(&self) -> String {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|(host, port)| format!("{host}:{port}"))
            .collect();
        format!(
            "the primary `{}` named by the sentinels {}",
            self.master_name,
            sentinels.join(",")
        )
    }
}

/// The primary of one Sentinel group, as the sentinels name it now.
pub(crate) struct SentinelTarget {
    spec: SentinelSpec,
    /// Certificates for a `rediss-sentinel://` group's sentinels and servers.
    tls: TlsFiles,
    timeouts: Timeouts,
    client: tokio::sync::Mutex<SentinelClient>,
    /// Bumped by every `+switch-master` announced for the group: a connection opened before
    /// it is to a server that may no longer be the primary.
    generation: AtomicU64,
    /// Told of every switch (the pub/sub connection, which then moves to the new primary).
    on_switch: Mutex<Vec<Box<dyn Fn() + Send + Sync>>>,
    /// The new primary the last switch announced, until the next lookup takes it: right after a
    /// switch, a sentinel that has not caught up would still name the old primary, which (in a
    /// failover with the old primary alive) still answers `ROLE` as a primary for a moment.
    announced: Mutex<Option<(String, u16)>>,
    /// The announcement listener: cleared when it ends (its runtime shut down, say), aborted
    /// when the target is dropped.
    listening: Mutex<Option<(Arc<AtomicBool>, tokio::task::AbortHandle)>>,
    hooks: SharedHooks,
}

impl SentinelTarget {
    pub(crate) fn open(
        spec: SentinelSpec,
        tls: &TlsFiles,
        timeouts: Timeouts,
        hooks: SharedHooks,
    ) -> Result<Arc<Self>, LockError> {
        let client = spec.client(tls).map_err(|err| {
            LockError::invalid_config("url", format!("{}: {err}", spec.describe()))
        })?;
        Ok(Arc::new(SentinelTarget {
            spec,
            tls: tls.clone(),
            timeouts,
            client: tokio::sync::Mutex::new(client),
            generation: AtomicU64::new(0),
            on_switch: Mutex::default(),
            announced: Mutex::default(),
            listening: Mutex::default(),
            hooks,
        }))
    }

    pub(crate) fn describe(&self) -> String {
        self.spec.describe()
    }

    /// How many switches were announced so far.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Calls `hook` on every announced switch.
    pub(crate) fn on_switch(&self, hook: impl Fn() + Send + Sync + 'static) {
        lock(&self.on_switch).push(Box::new(hook));
    }

    /// A client for the server the sentinels name as primary now (checked with `ROLE`), and the
    /// generation it belongs to. Starts listening for announcements, if not yet.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropping the future abandons the lookup; nothing is left half done.
    pub(crate) async fn resolve(self: &Arc<Self>) -> redis::RedisResult<(redis::Client, u64)> {
        self.keep_listening();
        let generation = self.generation();
        if let Some((host, port)) = lock(&self.announced).take() {
            return Ok((self.spec.primary_client(host, port, &self.tls)?, generation));
        }
        let lookup = async { self.client.lock().await.async_get_client().await };
        match tokio::time::timeout(self.timeouts.connect * 2, lookup).await {
            Ok(client) => Ok((client?, generation)),
            Err(_) => Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "no sentinel named a reachable primary in time",
            ))),
        }
    }

    fn keep_listening(self: &Arc<Self>) {
        let mut listening = lock(&self.listening);
        if listening
            .as_ref()
            .is_some_and(|(alive, _)| alive.load(Ordering::Acquire))
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let alive = Arc::new(AtomicBool::new(true));
        let target = Arc::downgrade(self);
        let flag = AliveFlag(alive.clone());
        let task = runtime.spawn(async move {
            let _alive = flag;
            listen(target).await;
        });
        *listening = Some((alive, task.abort_handle()));
    }

    fn switched(&self, new_primary: Option<(String, u16)>) {
        let _changed = hooks::LocalChange;
        *lock(&self.announced) = new_primary;
        self.generation.fetch_add(1, Ordering::AcqRel);
        for hook in lock(&self.on_switch).iter() {
            hook();
        }
    }
}

/// Follows `+switch-master` on one sentinel after another, for as long as the target lives.
///
/// # Cancel safety
/// Never dropped by a caller.
/// Runs as a spawned task, never dropped by a caller: aborted when the target is dropped, or
/// dropped with its runtime (its `AliveFlag` then lets the next `resolve` start another). Its
/// sentinel connection goes with it.
async fn listen(target: Weak<SentinelTarget>) {
    let mut retry = Duration::from_millis(20);
    // The sentinel tried first: the next one after each attempt, so that a sentinel that is
    // down (or drops the connection) is not asked again and again.
    let mut next = 0;
    loop {
        let Some(strong) = target.upgrade() else {
            return;
        };
        let sentinel = strong.spec.sentinel_client(next, &strong.tls);
        next += 1;
        let connected = async {
            let mut pubsub = sentinel?.get_async_pubsub().await?;
            pubsub.subscribe(SWITCH_MASTER).await?;
            redis::RedisResult::Ok(pubsub)
        };
        let connected = tokio::time::timeout(strong.timeouts.connect * 2, connected).await;
        let master_name = strong.spec.master_name.clone();
        drop(strong);
        match connected {
            Ok(Ok(pubsub)) => {
                retry = Duration::from_millis(20);
                let mut messages = pubsub.into_on_message();
                while let Some(message) = messages.next().await {
                    let payload: String = message.get_payload().unwrap_or_default();
                    // "<name> <old ip> <old port> <new ip> <new port>"
                    if payload.split(' ').next() != Some(master_name.as_str()) {
                        continue;
                    }
                    let Some(target) = target.upgrade() else {
                        return;
                    };
                    if hooks::read(&target.hooks).ignore_switch_announcements {
                        continue;
                    }
                    tracing::info!(
                        target: "distlock::sentinel",
                        master = %master_name,
                        announcement = %payload,
                        "the sentinels switched the primary; connections move to the new one"
                    );
                    // "<name> <old ip> <old port> <new ip> <new port>"
                    let mut fields = payload.split(' ').skip(3);
                    let new_primary = match (fields.next(), fields.next()) {
                        (Some(ip), Some(port)) => {
                            port.parse().ok().map(|port| (ip.to_owned(), port))
                        }
                        _ => None,
                    };
                    target.switched(new_primary);
                }
            }
            Ok(Err(err)) => tracing::debug!(
                target: "distlock::sentinel",
                error = %err,
                "no sentinel to follow failover announcements from; trying again"
            ),
            Err(_) => tracing::debug!(
                target: "distlock::sentinel",
                "no sentinel answered in time; trying again"
            ),
        }
        // The sentinel went away (or none answered): every switch missed meanwhile is caught by
        // the nodes themselves (a failed connection or READONLY re-resolves). Try again soon,
        // then less often.
        let jitter = Duration::from_micros(u64::from(rand_u16()) % 10_000);
        tokio::time::sleep(retry + jitter).await;
        retry = (retry * 2).min(MAX_LISTEN_RETRY);
    }
}

impl Drop for SentinelTarget {
    /// The listener holds a connection to a sentinel; it ends with the backend.
    fn drop(&mut self) {
        if let Some((_, task)) = lock(&self.listening).take() {
            task.abort();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn rand_u16() -> u16 {
    let mut bytes = [0u8; 2];
    let _ = getrandom::fill(&mut bytes);
    u16::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_sentinels_master_and_credentials() {
        let spec = SentinelSpec::parse(
            "redis-sentinel://app:s%40cret@10.0.0.1:26380,10.0.0.2,[::1]:5000/orders?db=2&sentinel_password=x",
        )
        .unwrap();
        assert_eq!(
            spec.sentinels,
            vec![
                ("10.0.0.1".to_owned(), 26380),
                ("10.0.0.2".to_owned(), SENTINEL_PORT),
                ("::1".to_owned(), 5000)
            ]
        );
        assert_eq!(spec.master_name, "orders");
        assert_eq!(spec.db, 2);
        assert_eq!(spec.username.as_deref(), Some("app"));
        assert_eq!(spec.password.as_deref(), Some("s@cret"));
        assert_eq!(spec.sentinel_password.as_deref(), Some("x"));
        assert_eq!(spec.sentinel_username, None);
    }

    #[test]
    fn bad_urls_say_what_is_wrong_without_the_password() {
        for (url, expected) in [
            ("redis-sentinel://10.0.0.1:26379", "names no master"),
            ("redis-sentinel://10.0.0.1:26379/", "names no master"),
            ("redis-sentinel://10.0.0.1:x/m", "gives `x` as a port"),
            ("redis-sentinel://a,,b/m", "empty sentinel address"),
            ("redis-sentinel://a/m?dbx=1", "unknown setting `dbx`"),
            ("redis-sentinel://a/m?db=one", "`db=one`"),
            ("redis-sentinel://:hunter2@a/m?db=one", "`db=one`"),
        ] {
            let err = SentinelSpec::parse(url).unwrap_err().to_string();
            assert!(err.contains(expected), "{url}: {err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
    }
}
