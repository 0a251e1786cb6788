//! What distlock logs: its spans never leak onto other tasks' events, and no owner token,
//! password or URL with credentials appears in any log line or in the `Debug`/`Display` of any
//! public type, over a run that exercises every path that logs.
//!
//! One global subscriber captures everything (every level, every target) for both tests.

mod common;

use common::PREFIX;
use distlock::__private::raw;
use distlock::{Backend, Lease, Lock, LockError, Released};
use distlock_test_support::{free_port, FaultProxy, RedisServer, Reply};
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Every event, with the names of the spans it was recorded in (innermost first).
#[derive(Default)]
struct Captured {
    events: Mutex<Vec<(String, Vec<&'static str>)>>,
    text: Mutex<Vec<u8>>,
}

struct Parentage(Arc<Captured>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Parentage {
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let spans = ctx
            .event_scope(event)
            .map(|scope| scope.map(|span| span.name()).collect())
            .unwrap_or_default();
        let target = event.metadata().target().to_owned();
        self.0.events.lock().unwrap().push((target, spans));
    }
}

struct TextWriter(Arc<Captured>);

impl Write for TextWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.text.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture() -> Arc<Captured> {
    static CAPTURED: OnceLock<Arc<Captured>> = OnceLock::new();
    CAPTURED
        .get_or_init(|| {
            let captured = Arc::new(Captured::default());
            let text = captured.clone();
            let subscriber = tracing_subscriber::registry()
                .with(Parentage(captured.clone()))
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_ansi(false)
                        .with_writer(move || TextWriter(text.clone())),
                );
            tracing::subscriber::set_global_default(subscriber).unwrap();
            captured
        })
        .clone()
}

/// On one thread, a task that logs every millisecond runs beside a watchdog whose renewals each
/// take tens of milliseconds (a slow link). A span entered across the renewal's await would be
/// the current span of every event the other task logs meanwhile.
#[test]
fn distlock_spans_never_parent_other_tasks_events() {
    let captured = capture();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.addr()).await;
        let backend = Backend::builder(proxy.url())
            .prefix(PREFIX)
            .watchdog_lease(Duration::from_millis(600))
            .build()
            .unwrap();
        let guard = Lock::new("parentage").on(&backend).acquire().await.unwrap();
        proxy.set_delay(Duration::from_millis(15));
        let ticker = tokio::spawn(async {
            let until = Instant::now() + Duration::from_millis(900);
            while Instant::now() < until {
                tracing::info!(target: "app::ticker", "tick");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        ticker.await.unwrap();
        let renewals = backend.stats().renewal_calls;
        assert!(
            renewals >= 3,
            "the watchdog renewed while the app logged: {renewals}"
        );
        assert!(guard.is_held());
        proxy.set_delay(Duration::ZERO);
        guard.release().await.unwrap();
    });
    let events = captured.events.lock().unwrap();
    let ticks: Vec<&Vec<&'static str>> = events
        .iter()
        .filter(|(target, _)| target == "app::ticker")
        .map(|(_, spans)| spans)
        .collect();
    assert!(ticks.len() >= 100, "only {} ticks logged", ticks.len());
    let adopted = ticks
        .iter()
        .filter(|spans| spans.iter().any(|name| name.starts_with("distlock")))
        .count();
    assert_eq!(
        adopted,
        0,
        "{adopted} of {} events of another task were logged inside a distlock span, e.g. {:?}",
        ticks.len(),
        ticks.iter().find(|spans| !spans.is_empty())
    );
}

/// Everything that must never be printed, collected as the run goes.
#[derive(Default)]
struct Secrets(Vec<String>);

impl Secrets {
    async fn owner_of(&mut self, backend: &Backend, key: &str) {
        let holder = backend.inspect(key).await.unwrap().expect("held");
        self.0.push(holder.owner);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_a_log_line_or_a_debug_string() {
    let captured = capture();
    let server = RedisServer::start();
    const PASSWORD: &str = "s3cret-pass-9f8e";
    const WRONG_PASSWORD: &str = "wr0ng-pass-1a2b";
    let mut setuser = vec!["ACL", "SETUSER", "locker", "on"];
    let password_rule = format!(">{PASSWORD}");
    setuser.push(&password_rule);
    let rules = distlock::redis::acl_rules(PREFIX);
    setuser.extend(rules.split(' '));
    assert_eq!(server.command(&setuser), Reply::Simple("OK".into()));
    let url = format!("redis://locker:{PASSWORD}@127.0.0.1:{}", server.port());
    let wrong_url = format!(
        "redis://locker:{WRONG_PASSWORD}@127.0.0.1:{}",
        server.port()
    );
    let mut secrets = Secrets(vec![
        PASSWORD.into(),
        WRONG_PASSWORD.into(),
        url.clone(),
        wrong_url.clone(),
    ]);
    let mut shown = Vec::<String>::new();
    let builder = Backend::builder(&url)
        .prefix(PREFIX)
        .watchdog_lease(Duration::from_millis(300));
    shown.push(format!("{builder:?}"));
    let holder = builder.clone().build().unwrap();
    let waiter = builder.build().unwrap();
    shown.push(format!("{holder:?}"));

    // Acquire, wait on a notification, hand over, renew, release.
    let guard = Lock::new("k1").on(&holder).acquire().await.unwrap();
    secrets.owner_of(&holder, "k1").await;
    shown.push(format!("{guard:?}"));
    shown.push(format!("{:?}", holder.inspect("k1").await.unwrap()));
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            Lock::new("k1")
                .on(&waiter)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        })
    };
    common::until_subscribers(&server, "k1", 1).await;
    guard.release().await.unwrap();
    let handed = waiting.await.unwrap().unwrap();
    secrets.owner_of(&waiter, "k1").await;
    tokio::time::sleep(Duration::from_millis(250)).await; // two renewal periods
    assert!(waiter.stats().renewed >= 1, "{:?}", waiter.stats());
    handed.release().await.unwrap();

    // A fixed lease that runs out: lost, then released after its expiry.
    let fixed = Lock::new("k2")
        .on(&holder)
        .lease(Lease::Fixed(Duration::from_millis(150)))
        .acquire()
        .await
        .unwrap();
    secrets.owner_of(&holder, "k2").await;
    let lost = tokio::time::timeout(Duration::from_secs(5), fixed.lost())
        .await
        .expect("the fixed lease is lost within its 150ms");
    shown.extend([format!("{lost:?}"), lost.to_string()]);
    // Lost by the client's reckoning, which runs ahead of the server's: the key expires there.
    common::assert_expires_on_server(&server, &holder, "k2").await;
    assert_eq!(fixed.release().await.unwrap(), Released::Expired);

    // A lease taken over on the server: the watchdog finds another owner.
    let taken_over = Lock::new("k3").on(&holder).acquire().await.unwrap();
    let victim = holder.inspect("k3").await.unwrap().unwrap().owner;
    secrets.0.push(victim.clone());
    assert_eq!(raw::release(&holder, "k3", &victim).await.unwrap(), 1);
    let thief = raw::new_owner();
    secrets.0.push(thief.clone());
    raw::acquire(&holder, "k3", &thief, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(5), taken_over.lost())
        .await
        .expect("the watchdog notices within a period");
    shown.extend([format!("{lost:?}"), lost.to_string()]);
    assert_eq!(taken_over.release().await.unwrap(), Released::TakenOver);
    let busy = Lock::new("k3").on(&waiter).acquire().await.unwrap_err();
    shown.extend([format!("{busy:?}"), busy.to_string()]);

    // Failures: a wrong password, an unreachable server, a malformed URL.
    let wrong = Backend::builder(&wrong_url).prefix(PREFIX).build().unwrap();
    let err = Lock::new("k4").on(&wrong).acquire().await.unwrap_err();
    assert!(
        err.to_string().contains("check the user name and password"),
        "{err}"
    );
    shown.extend([format!("{err:?}"), err.to_string()]);
    let nowhere = format!("redis://locker:{PASSWORD}@127.0.0.1:{}", free_port());
    secrets.0.push(nowhere.clone());
    let unreachable = Backend::builder(&nowhere)
        .connect_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let err = Lock::new("k5")
        .on(&unreachable)
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    shown.extend([format!("{err:?}"), err.to_string()]);
    // TLS that fails, with credentials and a client key: a TLS handshake a plain server never
    // answers, and an etcd member that is not there.
    let pki = distlock_test_support::TestPki::generate();
    let key = pki.client_key().to_string_lossy().into_owned();
    secrets.0.push(key.clone());
    let tls = format!("rediss://locker:{PASSWORD}@127.0.0.1:{}", server.port());
    let etcd = format!("etcds://locker:{PASSWORD}@127.0.0.1:{}", free_port());
    for url in [tls, etcd] {
        let backend = Backend::builder(&url)
            .prefix(PREFIX)
            .connect_timeout(Duration::from_millis(200))
            .tls_ca_file(pki.ca())
            .tls_client_auth_files(pki.client_cert(), &key)
            .build()
            .unwrap();
        let err = backend.ping().await.unwrap_err();
        assert!(matches!(err, LockError::Backend(_)), "{err:?}");
        shown.extend([format!("{err:?}"), err.to_string(), format!("{backend:?}")]);
    }
    let malformed = format!("redis://locker:{PASSWORD}@[::1");
    let err = Backend::builder(&malformed).build().unwrap_err();
    shown.extend([format!("{err:?}"), err.to_string()]);
    shown.push(format!(
        "{:?}",
        Lock::new("k6").on(&holder).wait(Duration::ZERO)
    ));
    shown.push(format!("{:?}", holder.stats()));

    let text = String::from_utf8(captured.text.lock().unwrap().clone()).unwrap();
    for needle in [
        "distlock.acquire",
        "distlock.release",
        "lock lost",
        "another owner",
    ] {
        assert!(
            text.contains(needle),
            "the run logged no `{needle}`:\n{text}"
        );
    }
    assert_eq!(secrets.0.len(), 11, "every secret was collected");
    for secret in &secrets.0 {
        if let Some(line) = text.lines().find(|line| line.contains(secret.as_str())) {
            panic!("a log line shows the secret `{secret}`: {line}");
        }
        if let Some(string) = shown.iter().find(|string| string.contains(secret.as_str())) {
            panic!("a Debug/Display string shows the secret `{secret}`: {string}");
        }
    }
    eprintln!(
        "SECRETS: {} log lines and {} Debug/Display strings checked for {} secrets (passwords, \
         URLs with credentials, owner tokens, a client key's path): none found",
        text.lines().count(),
        shown.len(),
        secrets.0.len()
    );
}

/// etcd counts leases in whole seconds: a 500 ms lease is held longer on the server, and the
/// backend says so once, with both figures, as a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_lease_held_longer_than_asked_is_warned_of_once() {
    let captured = capture();
    let cluster = distlock_test_support::EtcdCluster::start(3);
    let backend = Backend::builder(cluster.url())
        .prefix(PREFIX)
        .build()
        .unwrap();
    for i in 0..3 {
        Lock::new(format!("short-{i}"))
            .on(&backend)
            .lease(Lease::Fixed(Duration::from_millis(500)))
            .run(async {})
            .await
            .unwrap();
    }
    let text = String::from_utf8_lossy(&captured.text.lock().unwrap()).into_owned();
    let warning = "a lease of 500ms is held on the server for up to 1s";
    assert_eq!(text.matches(warning).count(), 1, "{text}");
    assert!(text.contains("WARN"), "{text}");
}

/// Behind a transaction-mode pooler, PostgreSQL's notifications cannot reach the backend: it
/// says so once, as a warning, and its waiters poll — they are still granted the lock in turn.
/// No statement logged shows an owner token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_mode_pooler_is_warned_of_once_and_its_waiters_poll() {
    let captured = capture();
    let server = common::Postgres::server();
    let bouncer = distlock_test_support::PgBouncer::start(
        &server,
        distlock_test_support::PoolMode::Transaction,
    );
    let backend = Backend::builder(bouncer.url())
        .prefix(PREFIX)
        .build()
        .unwrap();
    // The holder's backend: another process, as far as the queue is concerned.
    let holder = Backend::builder(bouncer.url())
        .prefix(PREFIX)
        .build()
        .unwrap();
    let mut owners = Vec::new();
    for round in 0..3 {
        let key = format!("pooled-{round}");
        let guard = Lock::new(key.clone()).on(&holder).acquire().await.unwrap();
        let waiter = tokio::spawn({
            let backend = backend.clone();
            async move {
                Lock::new(key)
                    .on(&backend)
                    .wait(Duration::from_secs(10))
                    .run(async {})
                    .await
            }
        });
        let lock = format!("{PREFIX}:{{pooled-{round}}}");
        let queued =
            common::postgres::until_on_postgres(&server, Duration::from_secs(5), async || {
                server.psql(&format!(
                    "SELECT count(*) FROM distlock.entries WHERE key = '{lock}'"
                )) == "2"
            })
            .await;
        assert!(queued, "the waiter never joined the queue");
        owners.extend(
            server
                .psql(&format!(
                    "SELECT owner FROM distlock.entries WHERE key = '{lock}'"
                ))
                .lines()
                .map(str::to_owned),
        );
        guard.release().await.unwrap();
        waiter.await.unwrap().unwrap();
    }
    let text = String::from_utf8_lossy(&captured.text.lock().unwrap()).into_owned();
    let warning = "LISTEN/NOTIFY does not reach this client";
    assert_eq!(text.matches(warning).count(), 1, "{text}");
    assert_eq!(owners.len(), 6);
    for owner in &owners {
        assert!(
            !text.contains(owner.as_str()),
            "an owner token was logged: {text}"
        );
    }
    assert!(text.contains("WARN"), "{text}");
}

/// On MySQL, where every request carries its owner written in (as a hex literal): a user with a
/// password takes, waits for and hands over a lock, and neither the password nor an owner token
/// (as text or as hex) reaches a log line or a `Debug` string.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_statements_and_passwords_reach_no_log_line() {
    const PASSWORD: &str = "my-s3cret-7d6c";
    let captured = capture();
    let server = common::Mysql::server();
    server.sql(&format!(
        "CREATE USER 'locker'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'; {}",
        distlock::mysql::grants("distlock", "'locker'@'127.0.0.1'").unwrap()
    ));
    let url = format!(
        "mysql://locker:{PASSWORD}@127.0.0.1:{}/distlock",
        server.port()
    );
    let builder = Backend::builder(&url).prefix(PREFIX);
    let (holder, waiter) = (builder.clone().build().unwrap(), builder.build().unwrap());
    let mut shown = vec![format!("{holder:?}")];
    let mut owners = Vec::new();
    for round in 0..3 {
        let key = format!("logged-{round}");
        let guard = Lock::new(key.clone()).on(&holder).acquire().await.unwrap();
        shown.push(format!("{guard:?}"));
        let waiting = tokio::spawn({
            let (waiter, key) = (waiter.clone(), key.clone());
            async move {
                Lock::new(key)
                    .on(&waiter)
                    .wait(Duration::from_secs(10))
                    .run(async {})
                    .await
            }
        });
        let lock = format!("{PREFIX}:{{{key}}}");
        let count = format!("SELECT COUNT(*) FROM distlock.entries WHERE lock_key = '{lock}'");
        let queued = common::mysql::until_on_mysql(&server, Duration::from_secs(5), async || {
            server.sql(&count) == "2"
        })
        .await;
        assert!(queued, "the waiter never joined the queue");
        let rows = server.sql(&format!(
            "SELECT CAST(owner AS CHAR) FROM distlock.entries WHERE lock_key = '{lock}'"
        ));
        owners.extend(rows.lines().map(str::to_owned));
        guard.release().await.unwrap();
        waiting.await.unwrap().unwrap();
    }
    let text = String::from_utf8_lossy(&captured.text.lock().unwrap()).into_owned();
    let shown = shown.join("\n");
    assert_eq!(owners.len(), 6);
    for secret in owners
        .iter()
        .flat_map(|owner| {
            let hex: String = owner.bytes().map(|byte| format!("{byte:02x}")).collect();
            [owner.clone(), hex]
        })
        .chain([PASSWORD.to_owned()])
    {
        assert!(!text.contains(&secret), "{secret} was logged: {text}");
        assert!(!shown.contains(&secret), "{secret} was shown: {shown}");
    }
}
