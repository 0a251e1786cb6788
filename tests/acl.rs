//! Redis ACL users: a least-privilege user with the rules `distlock::redis::acl_rules` returns can
//! do every lock operation — and the server logs no denied command while it does; a user without
//! pub/sub rights gets a clear error at once, never a hang or a silent fallback to polling.

mod common;

use common::{certain_backend_failure, spawn_waiter, PREFIX};
use distlock::__private::raw;
use distlock::{Backend, Check, Lease, Lock, LockKind, LostReason, Released};
use distlock_test_support::{RedisServer, Reply};
use std::time::{Duration, Instant};

/// Creates user `name` with password `secret` and `rules`; the URL it logs in with.
fn create_user(server: &RedisServer, name: &str, rules: &str) -> String {
    let password = format!(">{name}-secret");
    let mut setuser = vec!["ACL", "SETUSER", name, "on", &password];
    setuser.extend(rules.split(' '));
    assert_eq!(server.command(&setuser), Reply::Simple("OK".into()));
    format!("redis://{name}:{name}-secret@127.0.0.1:{}", server.port())
}

/// How many refusals the ACL LOG counts (entries group repeated refusals).
fn denials(server: &RedisServer) -> i64 {
    denied(server)
        .iter()
        .map(|entry| {
            let fields = entry.as_array().expect("an ACL LOG entry");
            let at = fields
                .iter()
                .position(|field| field.as_str().as_deref() == Some("count"))
                .expect("a count");
            fields[at + 1].as_int().expect("an integer count")
        })
        .sum()
}

/// Commands, keys and channels the server refused since the log was reset.
fn denied(server: &RedisServer) -> Vec<Reply> {
    match server.command(&["ACL", "LOG"]) {
        Reply::Array(Some(entries)) => entries,
        other => panic!("ACL LOG: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_user_can_do_every_operation() {
    let server = RedisServer::start();
    let url = create_user(&server, "locker", &distlock::redis::acl_rules(PREFIX));
    let ttl = Duration::from_millis(300);
    let build = || {
        Backend::builder(&url)
            .prefix(PREFIX)
            .watchdog_lease(ttl)
            .build()
            .unwrap()
    };
    let (holder, waiter) = (build(), build());
    raw::set_backoff_floor(&waiter, Duration::from_secs(30));

    // Acquire, inspect, renew across three periods.
    let guard = Lock::new("k").on(&holder).acquire().await.unwrap();
    let seen = holder.inspect("k").await.unwrap().expect("held");
    assert_eq!(seen.fencing_token, guard.fencing_token());
    // Wait on a notification.
    let waiting = spawn_waiter(&waiter, "k", Duration::from_secs(60));
    let channel = format!("{PREFIX}:{{k}}:released");
    let subscribed = server
        .wait_until(Duration::from_secs(5), async || {
            server.subscribers(&channel) == 1
        })
        .await;
    assert!(subscribed, "the waiter could not subscribe");
    tokio::time::sleep(ttl).await;
    assert!(guard.is_held());
    assert!(holder.stats().renewed >= 2, "{:?}", holder.stats());
    let released = Instant::now();
    assert_eq!(guard.release().await.unwrap(), Released::Released);
    let acquired = waiting.await.unwrap().unwrap();
    assert!(
        acquired - released < Duration::from_secs(5),
        "woken by the notification, not by backoff: {:?}",
        acquired - released
    );

    // Several keys at once; a fixed lease that expires and is released late; foreign tokens.
    Lock::keys(["a", "b"])
        .on(&holder)
        .run(async {})
        .await
        .unwrap();
    let fixed = Lock::new("fixed")
        .on(&holder)
        .lease(Lease::Fixed(Duration::from_millis(150)))
        .acquire()
        .await
        .unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(5), fixed.lost())
        .await
        .expect("lost within its lease");
    assert_eq!(lost.lost_reason(), Some(LostReason::Expired));
    // Lost by the client's reckoning, which runs ahead of the server's: the key expires there.
    common::assert_expires_on_server(&server, &holder, "fixed").await;
    assert_eq!(fixed.release().await.unwrap(), Released::Expired);
    let owner = raw::new_owner();
    assert!(raw::acquire(&holder, "raw", &owner, ttl)
        .await
        .unwrap()
        .is_some());
    assert_eq!(
        raw::release(&holder, "raw", &raw::new_owner())
            .await
            .unwrap(),
        -1
    );
    assert_eq!(raw::renew(&holder, "raw", &owner, ttl).await.unwrap(), 1);
    assert_eq!(raw::release(&holder, "raw", &owner).await.unwrap(), 1);

    // Read locks and semaphores: their holders live in a sorted set beside the lock key.
    let reader = Lock::new("shared")
        .on(&holder)
        .kind(LockKind::Read)
        .acquire()
        .await
        .unwrap();
    let writer = Lock::new("shared").on(&waiter).acquire().await.unwrap_err();
    assert!(writer.is_busy(), "{writer}");
    let seen = holder.inspect("shared").await.unwrap().expect("read-held");
    assert_eq!(seen.shared, Some(1));
    assert_eq!(reader.release().await.unwrap(), Released::Released);
    let permit = Lock::new("permits")
        .on(&holder)
        .kind(LockKind::Permits(2))
        .acquire()
        .await
        .unwrap();
    assert_eq!(permit.release().await.unwrap(), Released::Released);

    let refused = denied(&server);
    assert!(
        refused.is_empty(),
        "the server denied the lock user: {refused:?}"
    );

    // Outside its prefix the same user is refused, with advice.
    let other = Backend::builder(&url).prefix("other").build().unwrap();
    let err = Lock::new("k").on(&other).acquire().await.unwrap_err();
    let text = err.to_string();
    assert!(text.to_lowercase().contains("noperm"), "{text}");
    assert!(
        text.contains("grant it the rules `distlock::redis::acl_rules(\"other\")` returns"),
        "{text}"
    );
    assert!(!denied(&server).is_empty(), "the server logged the refusal");
}

/// A user granted the keys' release channels but not the process's handover channel (rules
/// narrower than `distlock::redis::acl_rules`): the refused subscription switches the channel
/// off, the waiter's next ask records it without one, and the release hands it the lock by the
/// key's channel — by the message, not by asking (which would not count as handed over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_handover_channel_leaves_handovers_on_the_keys_channel() {
    let server = RedisServer::start();
    let rules = distlock::redis::acl_rules(PREFIX).replace(
        &format!("&{PREFIX}:*"),
        &format!("&{PREFIX}:{{*}}:released"),
    );
    let url = create_user(&server, "narrow", &rules);
    // A label that starts as a channel field would: it must still read as the label.
    let build = || {
        Backend::builder(&url)
            .prefix(PREFIX)
            .holder_label(">narrow")
            .build()
            .unwrap()
    };
    let (holder, waiting) = (build(), build());
    let long = Duration::from_secs(10);
    raw::set_backoff_floor(&waiting, long);
    let held = Lock::new("k")
        .on(&holder)
        .lease(Lease::Fixed(long))
        .acquire()
        .await
        .unwrap();
    let waiter = spawn_waiter(&waiting, "k", long);
    // Asked, subscribed (the handover channel refused meanwhile), asked again.
    let asked_twice = raw::until_local(long, async || waiting.stats().busy_replies >= 2).await;
    assert!(asked_twice, "{:?}", waiting.stats());
    let refused: Vec<String> = denied(&server)
        .iter()
        .flat_map(|entry| entry.as_array().unwrap_or_default())
        .filter_map(Reply::as_str)
        .collect();
    assert!(
        refused
            .iter()
            .any(|field| field.starts_with(&format!("{PREFIX}:handover:"))),
        "the handover channel was not refused: {refused:?}"
    );
    assert_eq!(held.release().await.unwrap(), Released::Released);
    waiter.await.unwrap().unwrap();
    assert_eq!(waiting.stats().handed_over, 1, "{:?}", waiting.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_pubsub_rights_gets_a_clear_error_not_a_hang() {
    let server = RedisServer::start();
    let rules = distlock::redis::acl_rules(PREFIX).replace(&format!(" &{PREFIX}:*"), "");
    assert!(
        rules.contains("resetchannels") && !rules.contains('&'),
        "{rules}"
    );
    let url = create_user(&server, "nochannels", &rules);
    let holder = Backend::builder(&url).prefix(PREFIX).build().unwrap();
    let waiter = Backend::builder(&url).prefix(PREFIX).build().unwrap();
    let guard = Lock::new("k").on(&holder).acquire().await.unwrap();

    let started = Instant::now();
    let err = Lock::new("k")
        .on(&waiter)
        .wait(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap_err();
    let took = started.elapsed();
    let failure = certain_backend_failure(&err);
    assert_eq!(failure.operation(), distlock::Operation::Subscribe, "{err}");
    let text = err.to_string();
    assert!(text.to_lowercase().contains("noperm"), "{text}");
    assert!(text.contains("distlock::redis::acl_rules(\"t\")"), "{text}");
    assert!(
        took < Duration::from_secs(2),
        "failed at once, not after the budget: {took:?}"
    );
    // The failed call was the lock's next waiter: it gives that place up in the background, and
    // then nothing of it is left.
    let cleaned_up = raw::until_local(Duration::from_secs(5), async || {
        raw::local_keys(&waiter) == 0 && raw::watched_channels(&waiter) == 0
    })
    .await;
    assert!(cleaned_up, "{} local keys", raw::local_keys(&waiter));
    assert_eq!(waiter.stats().background_releases, 1);

    // The holder's release may not publish: the release stands all the same.
    assert_eq!(guard.release().await.unwrap(), Released::Released);
    assert_eq!(holder.inspect("k").await.unwrap(), None);
    eprintln!("ACL without pub/sub rights: waiting failed after {took:?} with: {text}");
}

/// The doctor checks the URL's user with `ACL DRYRUN`: a user without the release channels is
/// named with the rules to grant; the full rules leave nothing to report; a user that may not
/// run `ACL DRYRUN` gets "unchecked", never a silent pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_doctor_names_missing_rights_of_the_lock_user() {
    let server = RedisServer::start();
    let inspect_rights = " +acl|whoami +acl|dryrun +config|get +info";
    let full = distlock::redis::acl_rules(PREFIX) + inspect_rights;
    let url = create_user(&server, "full", &full);
    let backend = Backend::builder(&url).prefix(PREFIX).build().unwrap();
    let findings = backend.doctor().await.unwrap();
    assert!(
        findings
            .iter()
            .all(|f| f.check != Check::Acl && f.check != Check::Unchecked),
        "{findings:?}"
    );

    let no_channels = distlock::redis::acl_rules(PREFIX).replace(&format!(" &{PREFIX}:*"), "");
    let url = create_user(&server, "nochan", &(no_channels + inspect_rights));
    let backend = Backend::builder(&url).prefix(PREFIX).build().unwrap();
    let findings = backend.doctor().await.unwrap();
    let acl = findings
        .iter()
        .find(|f| f.check == Check::Acl)
        .unwrap_or_else(|| panic!("no acl finding: {findings:?}"));
    assert!(acl.advice.contains("`nochan`"), "{acl}");
    assert!(acl.advice.contains("SUBSCRIBE"), "{acl}");
    assert!(acl.advice.contains("ACL SETUSER nochan"), "{acl}");

    let url = create_user(&server, "plain", &distlock::redis::acl_rules(PREFIX));
    let backend = Backend::builder(&url).prefix(PREFIX).build().unwrap();
    let findings = backend.doctor().await.unwrap();
    assert!(
        findings
            .iter()
            .any(|f| f.check == Check::Unchecked && f.advice.contains("ACL")),
        "{findings:?}"
    );
}

/// `ping` (and `connect`, which builds and pings) fails at once with the error a lock would meet,
/// its advice included: a wrong password, keys outside the user's pattern, release channels the
/// user may not subscribe to; with the full rules it passes, and counts nothing in the stats.
/// A lock user, which may not ask about its own rights, is refused that question once: pinging
/// it every few seconds does not fill the server's ACL LOG.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_names_a_wrong_password_and_a_missing_right() {
    let server = RedisServer::start();
    let url = create_user(&server, "locker", &distlock::redis::acl_rules(PREFIX));
    server.command(&["ACL", "LOG", "RESET"]);
    let backend = Backend::builder(&url)
        .prefix(PREFIX)
        .connect()
        .await
        .unwrap();
    for _ in 0..5 {
        backend.ping().await.unwrap();
    }
    assert_eq!(denials(&server), 1, "{:?}", denied(&server));
    let stats = backend.stats();
    assert_eq!((stats.acquired, stats.released), (0, 0), "{stats:?}");
    assert_eq!(
        server.command(&["DBSIZE"]),
        Reply::Int(1),
        "only the probe's token marker"
    );

    let wrong = url.replace("locker-secret", "not-the-secret");
    let err = Backend::builder(&wrong)
        .prefix(PREFIX)
        .connect()
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("rejected the credentials; check the user name and password"),
        "{text}"
    );
    assert!(!text.contains("not-the-secret"), "password leaked: {text}");
    eprintln!("ping, wrong password: {text}");

    let other_keys = distlock::redis::acl_rules("other");
    let url = create_user(&server, "elsewhere", &other_keys);
    let backend = Backend::builder(&url).prefix(PREFIX).build().unwrap();
    let text = backend.ping().await.unwrap_err().to_string();
    assert!(text.to_lowercase().contains("noperm"), "{text}");
    assert!(text.contains("distlock::redis::acl_rules(\"t\")"), "{text}");
    eprintln!("ping, keys outside the user's pattern: {text}");

    let no_channels = distlock::redis::acl_rules(PREFIX).replace(&format!(" &{PREFIX}:*"), "");
    let url = create_user(&server, "nochannels", &no_channels);
    let backend = Backend::builder(&url).prefix(PREFIX).build().unwrap();
    let text = backend.ping().await.unwrap_err().to_string();
    assert!(text.to_lowercase().contains("noperm"), "{text}");
    eprintln!("ping, no release channels: {text}");

    // A right the probe does not use (`ZADD`: queues, readers), found by the doctor's check.
    let rules =
        distlock::redis::acl_rules(PREFIX).replace(" +zadd", "") + " +acl|whoami +acl|dryrun";
    let url = create_user(&server, "nozadd", &rules);
    let backend = Backend::builder(&url).prefix(PREFIX).build().unwrap();
    let text = backend.ping().await.unwrap_err().to_string();
    assert!(
        text.contains("ZADD") && text.contains("ACL SETUSER nozadd"),
        "{text}"
    );
    eprintln!("ping, no ZADD: {text}");
}

/// A Sentinel group over TLS whose primary and replica have a lock user with the rules
/// `distlock::redis::acl_rules` returns (the sentinels keep their own users): that user takes,
/// waits for and releases locks with replica acknowledgement, and no server logs a denied
/// command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_user_locks_through_the_sentinels() {
    let group = distlock_test_support::SentinelGroup::start_tls(1, Duration::from_secs(5));
    let rules = distlock::redis::acl_rules(PREFIX);
    for server in [group.primary(), group.replica()] {
        create_user(server, "locker", &rules);
        assert_eq!(
            server.command(&["ACL", "LOG", "RESET"]),
            Reply::Simple("OK".into())
        );
    }
    let url = group.sentinel_url().replace(
        "rediss-sentinel://",
        "rediss-sentinel://locker:locker-secret@",
    );
    let build = || {
        Backend::builder(&url)
            .prefix(PREFIX)
            .tls_ca_file(group.pki().unwrap().ca())
            .min_replicas(1)
            .build()
            .unwrap()
    };
    let (holder, waiter) = (build(), build());
    holder.ping().await.expect("the lock user's rights suffice");
    // The ping asks (`ACL WHOAMI`) whether the user may check its rights, and is refused once:
    // the only refusal that is expected.
    for server in [group.primary(), group.replica()] {
        server.command(&["ACL", "LOG", "RESET"]);
    }
    let guard = Lock::new("sentinel-acl")
        .on(&holder)
        .acquire()
        .await
        .unwrap();
    let waiting = spawn_waiter(&waiter, "sentinel-acl", Duration::from_secs(30));
    assert_eq!(guard.release().await.unwrap(), Released::Released);
    waiting.await.unwrap().unwrap();
    for server in [group.primary(), group.replica()] {
        assert_eq!(
            denials(server),
            0,
            "refused on port {}: {:?}",
            server.port(),
            denied(server)
        );
    }
}
