//! The real `distlock` binary against real servers the harness starts: what an operator sees
//! (text and JSON), and the exit codes scripts branch on.

use distlock::{Backend, Lease, Lock, LockError, LostReason};
use distlock_test_support::{RedisCluster, RedisServer, SentinelGroup};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const DISTLOCK: &str = env!("CARGO_BIN_EXE_distlock");

/// Runs `distlock` with `args` against `url`, never the caller's environment.
fn distlock(url: &str, args: &[&str]) -> Output {
    Command::new(DISTLOCK)
        .args(args)
        .env("DISTLOCK_URL", url)
        .env_remove("DISTLOCK_PREFIX")
        .env_remove("DISTLOCK_SCHEMA")
        .output()
        .expect("the distlock binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|err| panic!("not JSON ({err}): {}", stdout(output)))
}

/// `--json` output: one object per line (NDJSON), for every command.
fn ndjson(output: &Output) -> Vec<Value> {
    stdout(output)
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|err| panic!("not JSON ({err}): {line}"))
        })
        .collect()
}

fn backend(url: &str, label: &str) -> Backend {
    Backend::builder(url)
        .holder_label(label)
        .watchdog_lease(Duration::from_millis(900))
        .build()
        .expect("a valid URL")
}

/// Waits for `n` processes subscribed to `key`'s release channel (the default prefix).
async fn until_waiting(server: &RedisServer, key: &str, n: i64) {
    let channel = format!("distlock:{{{key}}}:released");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let reply = server.command(&["PUBSUB", "NUMSUB", &channel]);
        let count = reply.as_array().and_then(|pair| pair.get(1)?.as_int());
        if count == Some(n) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{key}: {count:?} waiting, never {n}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_list_and_unlock_a_live_lock() {
    let server = RedisServer::start();
    let url = server.url();
    let app = backend(&url, "billing-worker-1");
    let guard = Lock::new("order:17").on(&app).acquire().await.unwrap();
    let _other = Lock::new("order:18")
        .on(&app)
        .lease(Lease::Fixed(Duration::from_secs(60)))
        .acquire()
        .await
        .unwrap();
    let owner = app.inspect("order:17").await.unwrap().unwrap().owner;

    // Someone in another process waits for it.
    let contender = backend(&url, "billing-worker-2");
    let waiter = tokio::spawn(async move {
        Lock::new("order:17")
            .on(&contender)
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .map(|guard| guard.fencing_token())
    });
    until_waiting(&server, "order:17", 1).await;

    let text = distlock(&url, &["inspect", "order:17", "order:99"]);
    assert_eq!(text.status.code(), Some(1), "one key is free: {text:?}");
    let shown = stdout(&text);
    assert!(
        shown.contains("order:17  held by billing-worker-1"),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("token {}", guard.fencing_token())),
        "{shown}"
    );
    assert!(shown.contains("1 process(es) waiting"), "{shown}");
    assert!(shown.contains("order:99  free"), "{shown}");
    assert!(
        !shown.contains(&owner),
        "the owner token is a credential: {shown}"
    );

    let held = distlock(&url, &["--json", "inspect", "order:17"]);
    assert_eq!(held.status.code(), Some(0));
    let held = json(&held);
    assert_eq!(held["held"], true);
    assert_eq!(held["label"], "billing-worker-1");
    assert_eq!(held["fencing_token"], guard.fencing_token());
    assert_eq!(held["waited_on"], true);
    assert_eq!(held["waiting"], 1);
    assert_eq!(held["deployment"], "redis");
    let ttl = held["ttl_ms"].as_u64().unwrap();
    assert!(ttl > 0 && ttl <= 900, "{ttl}");

    let listed = distlock(&url, &["--json", "list", "--pattern", "order:*"]);
    assert_eq!(listed.status.code(), Some(0));
    let keys: Vec<String> = ndjson(&listed)
        .iter()
        .map(|lock| lock["key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys, ["order:17", "order:18"], "soonest to expire first");
    let none = distlock(&url, &["list", "--pattern", "invoice:*"]);
    assert_eq!(none.status.code(), Some(1));
    assert!(stdout(&none).contains("no lock held"), "{}", stdout(&none));

    let refused = distlock(&url, &["unlock", "order:17"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr(&refused).contains("without --force"),
        "{}",
        stderr(&refused)
    );
    assert!(
        app.inspect("order:17").await.unwrap().is_some(),
        "still held"
    );

    let removed = distlock(&url, &["unlock", "order:17", "--force"]);
    assert_eq!(removed.status.code(), Some(0), "{removed:?}");
    assert!(
        stdout(&removed).contains("removed the lock by billing-worker-1"),
        "{}",
        stdout(&removed)
    );
    // The waiter is woken and takes it with a larger token; the removed holder learns its
    // lease is gone at its next renewal.
    let next_token = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was woken")
        .unwrap()
        .expect("the waiter got the lock");
    assert!(next_token > guard.fencing_token());
    let lost = tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("the removed holder is told");
    assert!(
        matches!(
            lost,
            LockError::Lost {
                reason: LostReason::TakenOver | LostReason::Gone,
                ..
            }
        ),
        "{lost:?}"
    );
    let again = distlock(&url, &["--json", "unlock", "order:99", "--force"]);
    assert_eq!(again.status.code(), Some(1), "nothing to remove");
    assert_eq!(json(&again)["removed"], false);
}

/// `distlock watch <args>` on `url`, running once it said what it watches (on stderr, which it
/// then no longer reads).
fn watching(url: &str, args: &[&str]) -> std::process::Child {
    let mut watch = Command::new(DISTLOCK)
        .arg("watch")
        .args(args)
        .env("DISTLOCK_URL", url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut started = String::new();
    BufReader::new(watch.stderr.take().unwrap())
        .read_line(&mut started)
        .unwrap();
    assert!(
        started.starts_with(&format!("watching `{}`", args[0])),
        "{started}"
    );
    watch
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_shows_acquire_release_and_expiry_live() {
    let server = RedisServer::start();
    let url = server.url();
    let app = backend(&url, "worker-9");
    let mut watch = watching(
        &url,
        &["job:1", "--enable-notifications", "--json", "--count", "7"],
    );
    let (lines, events) = std::sync::mpsc::channel();
    let stdout = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let _ = lines.send(line.unwrap());
        }
    });
    let next = || -> Value {
        let line = events
            .recv_timeout(Duration::from_secs(5))
            .expect("an event within 5 s");
        serde_json::from_str(&line).unwrap()
    };

    // A fixed lease: no renewal between the events this test expects.
    let guard = Lock::new("job:1")
        .on(&app)
        .lease(Lease::Fixed(Duration::from_secs(10)))
        .acquire()
        .await
        .unwrap();
    let acquired = next();
    assert_eq!(acquired["event"], "acquired", "{acquired}");
    assert_eq!(acquired["label"], "worker-9");
    assert_eq!(acquired["fencing_token"], guard.fencing_token());
    guard.release().await.unwrap();
    let released = next();
    assert_eq!(released["event"], "released", "{released}");
    assert_eq!(released["held"], false);

    let dying = Lock::new("job:1")
        .on(&app)
        .lease(Lease::Fixed(Duration::from_millis(150)))
        .acquire()
        .await
        .unwrap();
    assert_eq!(next()["event"], "acquired");
    let expired = next();
    assert_eq!(expired["event"], "expired", "{expired}");
    drop(dying);

    // A watchdog lease (900 ms, renewed every 300 ms): renewals show as such.
    let renewed = Lock::new("job:1").on(&app).acquire().await.unwrap();
    assert_eq!(next()["event"], "acquired");
    let renewal = next();
    assert_eq!(renewal["event"], "renewed", "{renewal}");
    assert_eq!(renewal["fencing_token"], renewed.fencing_token());
    renewed.release().await.unwrap();
    assert_eq!(next()["event"], "released");
    let status = watch.wait().unwrap();
    assert_eq!(status.code(), Some(0), "it stops after --count events");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_names_the_setting_when_notifications_are_off() {
    let server = RedisServer::start();
    let refused = distlock(&server.url(), &["watch", "job:1"]);
    assert_eq!(refused.status.code(), Some(3));
    let message = stderr(&refused);
    assert!(
        message.contains("keyspace notifications are off"),
        "{message}"
    );
    assert!(message.contains("--enable-notifications"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_findings_and_errors_have_exit_codes() {
    let server = RedisServer::start();
    server.command(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    let found = distlock(&server.url(), &["--json", "doctor"]);
    assert_eq!(found.status.code(), Some(1), "{found:?}");
    let checks: Vec<String> = ndjson(&found)
        .iter()
        .map(|finding| finding["check"].as_str().unwrap().to_owned())
        .collect();
    assert!(checks.contains(&"eviction".to_owned()), "{checks:?}");
    let text = distlock(&server.url(), &["doctor"]);
    assert!(
        stdout(&text).contains("maxmemory-policy noeviction"),
        "{}",
        stdout(&text)
    );

    let port = server.port();
    drop(server);
    let down = distlock(&format!("redis://127.0.0.1:{port}"), &["inspect", "x"]);
    assert_eq!(down.status.code(), Some(3), "{down:?}");
    assert!(
        stderr(&down).contains(&format!(
            "backend `redis://127.0.0.1:{port}` failed during inspect"
        )),
        "the backend is named by its URL: {}",
        stderr(&down)
    );
    // With --json, errors are objects too, with a kind a script can match.
    let down = distlock(
        &format!("redis://127.0.0.1:{port}"),
        &["--json", "inspect", "x"],
    );
    let error: Value = serde_json::from_str(stderr(&down).trim()).unwrap();
    assert_eq!(error["error"]["kind"], "backend", "{error}");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("failed during inspect"));
    let usage = distlock("memory://", &["--json", "list"]);
    let error: Value = serde_json::from_str(stderr(&usage).trim()).unwrap();
    assert_eq!(error["error"]["kind"], "usage", "{error}");
    // A mistyped command: clap's suggestion, and the usage exit code.
    let typo = distlock(&format!("redis://127.0.0.1:{port}"), &["inspecct", "x"]);
    assert_eq!(typo.status.code(), Some(2));
    assert!(
        stderr(&typo).contains("similar subcommand exists: 'inspect'"),
        "{}",
        stderr(&typo)
    );
    // Completions: a script for the shell, naming the commands.
    let completions = distlock("", &["completions", "bash"]);
    assert_eq!(completions.status.code(), Some(0), "{completions:?}");
    assert!(stdout(&completions).contains("inspect") && stdout(&completions).contains("_distlock"));
    let memory = distlock("memory://", &["list"]);
    assert_eq!(memory.status.code(), Some(2));
    assert!(
        stderr(&memory).contains("in-process backend"),
        "{}",
        stderr(&memory)
    );
    let bad = distlock("redis://127.0.0.1:1,redis://127.0.0.1:2", &["list"]);
    assert_eq!(bad.status.code(), Some(3));
    assert!(stderr(&bad).contains("at least 3"), "{}", stderr(&bad));
}

/// The same commands on every Redis deployment: Redlock over three masters, a Redis Cluster, and
/// a Sentinel group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_backend_kind_answers() {
    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let redlock = masters
        .iter()
        .map(RedisServer::url)
        .collect::<Vec<_>>()
        .join(",");
    let cluster = RedisCluster::start(3, 0, Duration::from_millis(2000));
    let sentinel = SentinelGroup::start(Duration::from_millis(2000));
    for (kind, url) in [
        ("redlock", redlock),
        ("cluster", cluster.url()),
        ("sentinel", sentinel.sentinel_url()),
    ] {
        answers(kind, &url).await;
    }
}

/// The same commands on an etcd cluster of three members.
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_answers_too() {
    let cluster = distlock_test_support::EtcdCluster::start(3);
    answers("etcd", &cluster.url()).await;
}

/// The same commands on a ZooKeeper ensemble of three servers; `watch` follows a lock's nodes.
#[cfg(feature = "zookeeper")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_answers_too() {
    let ensemble = distlock_test_support::ZkEnsemble::start(3);
    let url = ensemble.url();
    answers("zookeeper", &url).await;
    let watch = watching(&url, &["job:1", "--json", "--count", "2"]);
    let app = backend(&url, "zk-worker");
    Lock::new("job:1").on(&app).run(async {}).await.unwrap();
    let output = watch.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let events: Vec<Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    eprintln!("ZOOKEEPER watch: {events:?}");
    let kinds: Vec<&Value> = events.iter().map(|event| &event["event"]).collect();
    assert_eq!(
        kinds,
        ["create", "delete"],
        "the entry made, then deleted: {events:?}"
    );
}

/// `inspect`, `list` and `unlock` of locks `kind`'s deployment at `url` holds.
async fn answers(kind: &str, url: &str) {
    let app = backend(url, &format!("{kind}-worker"));
    let mut guards = Vec::new();
    for key in ["a:1", "a:2", "b:1"] {
        guards.push(Lock::new(key).on(&app).acquire().await.unwrap());
    }
    let inspected = distlock(url, &["--json", "inspect", "a:1"]);
    assert_eq!(inspected.status.code(), Some(0), "{kind}: {inspected:?}");
    let inspected = json(&inspected);
    assert_eq!(inspected["deployment"], kind);
    assert_eq!(inspected["label"], format!("{kind}-worker"));
    assert_eq!(inspected["fencing_token"], guards[0].fencing_token());

    let listed = ndjson(&distlock(url, &["--json", "list", "--pattern", "a:*"]));
    assert_eq!(listed.len(), 2, "{kind}: {listed:?}");

    let removed = distlock(url, &["unlock", "b:1", "--force"]);
    assert_eq!(removed.status.code(), Some(0), "{kind}: {removed:?}");
    assert!(app.inspect("b:1").await.unwrap().is_none(), "{kind}");
    let free = distlock(url, &["inspect", "b:1"]);
    assert_eq!(free.status.code(), Some(1), "{kind}");
    for guard in guards.drain(..2) {
        guard.release().await.unwrap();
    }
}

/// A read lock held by two processes shows as shared, with how many hold it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_lock_shows_its_holders() {
    let server = RedisServer::start();
    let url = server.url();
    let first = backend(&url, "reader-1");
    let second = backend(&url, "reader-2");
    let _a = Lock::new("doc:1")
        .kind(distlock::LockKind::Read)
        .on(&first)
        .acquire()
        .await
        .unwrap();
    let _b = Lock::new("doc:1")
        .kind(distlock::LockKind::Read)
        .on(&second)
        .acquire()
        .await
        .unwrap();
    let shown = distlock(&url, &["inspect", "doc:1"]);
    assert_eq!(shown.status.code(), Some(0));
    assert!(
        stdout(&shown).contains("2 holder(s) sharing it, one reader-"),
        "{}",
        stdout(&shown)
    );
    let json = json(&distlock(&url, &["--json", "inspect", "doc:1"]));
    assert_eq!(json["shared"], 2);
    assert_eq!(json["held"], true);
}

/// `watch` reports a failed step of its stream (here: the server refuses the script that reads
/// the holder after a notification) and exits 3 — events may have been missed — not 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_exits_3_after_its_stream_failed() {
    let server = RedisServer::start();
    let mut watch = Command::new(DISTLOCK)
        .args(["watch", "job:1", "--enable-notifications", "--count", "1"])
        .env("DISTLOCK_URL", server.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr_lines = BufReader::new(watch.stderr.take().unwrap()).lines();
    let started = stderr_lines.next().unwrap().unwrap();
    assert!(started.starts_with("watching `job:1`"), "{started}");
    // The subscription is in force; from now on the user may not run scripts.
    server.command(&["ACL", "SETUSER", "default", "-evalsha", "-eval"]);
    server.command(&["SET", "distlock:{job:1}", "L1 someone", "PX", "10000"]);
    let status = watch.wait().unwrap();
    let reported: Vec<String> = stderr_lines.map(Result::unwrap).collect();
    assert_eq!(status.code(), Some(3), "{reported:?}");
    assert!(
        reported
            .iter()
            .any(|line| line.to_lowercase().contains("noperm")),
        "{reported:?}"
    );
}

/// On PostgreSQL: the schema the CLI prints, run as a migration would, serves the same
/// commands; `--schema` names another one, and a name that is no plain identifier is a usage
/// error.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_answers_too_on_the_schema_it_prints() {
    let server = distlock_test_support::PgServer::start();
    let printed = distlock("", &["schema", "postgres"]);
    assert_eq!(printed.status.code(), Some(0), "{printed:?}");
    assert!(stdout(&printed).contains("CREATE TABLE IF NOT EXISTS distlock.entries"));
    server.psql(&stdout(&printed));
    answers("postgres", &server.url()).await;

    let other = stdout(&distlock(
        "",
        &["schema", "postgres", "--schema", "ops_locks"],
    ));
    assert!(
        other.contains("CREATE SCHEMA IF NOT EXISTS ops_locks;"),
        "{other}"
    );
    assert!(!other.contains("distlock."), "{other}");
    let missing = distlock(&server.url(), &["--schema", "ops_locks", "inspect", "a:1"]);
    assert_eq!(missing.status.code(), Some(3), "{missing:?}");
    assert!(
        stderr(&missing).contains("distlock schema postgres --schema ops_locks"),
        "{}",
        stderr(&missing)
    );
    let bad = distlock("", &["schema", "postgres", "--schema", "Ops-Locks"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(
        stderr(&bad).contains("lowercase SQL identifier"),
        "{}",
        stderr(&bad)
    );
}

/// On MySQL (a MariaDB server of the harness's own): the schema the CLI prints, fed to the
/// `mariadb` client as a migration would, serves the same commands; a name that is no plain
/// identifier is a usage error.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_answers_too_on_the_schema_it_prints() {
    let server = distlock_test_support::MariaDbServer::start();
    let printed = distlock("", &["schema", "mysql"]);
    assert_eq!(printed.status.code(), Some(0), "{printed:?}");
    assert!(stdout(&printed).contains("CREATE TABLE IF NOT EXISTS distlock.entries"));
    server.sql(&stdout(&printed));
    answers("mysql", &server.url()).await;
    let missing = distlock(&server.url(), &["--schema", "ops_locks", "inspect", "a:1"]);
    assert_eq!(missing.status.code(), Some(3), "{missing:?}");
    assert!(
        stderr(&missing).contains("distlock schema mysql --schema ops_locks"),
        "{}",
        stderr(&missing)
    );
    let bad = distlock("", &["schema", "mysql", "--schema", "Ops-Locks"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    // MySQL tells no change to another connection: nothing to follow, said at once.
    let watch = distlock(&server.url(), &["watch", "a:1"]);
    assert_eq!(watch.status.code(), Some(3), "{watch:?}");
    assert!(
        stderr(&watch).contains("tells no change"),
        "{}",
        stderr(&watch)
    );
}

/// `distlock acl mysql` prints the library's GRANTs for `--schema` and `--user`.
#[test]
fn acl_prints_the_grants_of_a_mysql_lock_user() {
    let printed = distlock(
        "",
        &["--schema", "ops_locks", "acl", "mysql", "--user", "locker"],
    );
    #[cfg(feature = "mysql")]
    assert_eq!(
        stdout(&printed),
        distlock::mysql::grants("ops_locks", "locker").unwrap()
    );
    #[cfg(not(feature = "mysql"))]
    assert_eq!(printed.status.code(), Some(2), "{printed:?}");
}

/// `distlock acl <store>` prints the library's rules for the prefix and user (tests/acl.rs and
/// tests/tls.rs apply them to real servers).
#[test]
fn acl_prints_the_rights_of_a_lock_user() {
    let redis = distlock(
        "",
        &["--prefix", "billing", "acl", "redis", "--user", "locker"],
    );
    assert_eq!(redis.status.code(), Some(0), "{redis:?}");
    assert_eq!(
        stdout(&redis),
        format!(
            "ACL SETUSER locker {}\n",
            distlock::redis::acl_rules("billing")
        )
    );
    let cluster = stdout(&distlock(
        "",
        &["--prefix", "billing", "acl", "redis-cluster"],
    ));
    assert_eq!(
        cluster,
        format!(
            "ACL SETUSER distlock {}\n",
            distlock::redis::cluster_acl_rules("billing")
        )
    );
    let etcd = distlock(
        "",
        &["--prefix", "billing", "acl", "etcd", "--user", "locker"],
    );
    #[cfg(feature = "etcd")]
    assert_eq!(
        stdout(&etcd),
        distlock::etcd::acl_commands("billing", "locker")
    );
    #[cfg(not(feature = "etcd"))]
    assert_eq!(etcd.status.code(), Some(2), "{etcd:?}");
}

/// `distlock acl postgres` prints the library's GRANTs for `--schema` and `--user`.
#[test]
fn acl_prints_the_grants_of_a_postgres_lock_user() {
    let printed = distlock(
        "",
        &[
            "--schema",
            "ops_locks",
            "acl",
            "postgres",
            "--user",
            "locker",
        ],
    );
    #[cfg(feature = "postgres")]
    assert_eq!(
        stdout(&printed),
        distlock::postgres::grants("ops_locks", "locker").unwrap()
    );
    #[cfg(not(feature = "postgres"))]
    assert_eq!(printed.status.code(), Some(2), "{printed:?}");
}
