//! TLS end to end: a redis-server with a TLS port and certificates made at test time, locks over
//! `rediss://` (acquire, watchdog renewal, release, release notifications), client certificates,
//! and the errors a wrong CA or a misplaced setting produce.

mod common;

use common::{certain_backend_failure, spawn_waiter, PREFIX};
use distlock::__private::raw;
use distlock::{Backend, BackendBuilder, Lock, Registry, Released};
use distlock_test_support::{free_port, RedisServer, ServerConfig, TestPki};
use std::time::{Duration, Instant};

/// A redis-server with a TLS port, and the `rediss://` URL of that port.
fn tls_server(pki: &TestPki, verify_clients: bool) -> (RedisServer, String) {
    let tls_port = free_port();
    let server = RedisServer::start_with(pki.serve(ServerConfig::new(), tls_port, verify_clients));
    (server, format!("rediss://127.0.0.1:{tls_port}"))
}

fn builder(url: &str) -> BackendBuilder {
    Backend::builder(url)
        .prefix(PREFIX)
        .connect_timeout(Duration::from_secs(2))
}

/// Clients on the TLS port only, as the server sees them.
fn tls_clients(server: &RedisServer) -> usize {
    let list = server.command(&["CLIENT", "LIST"]).as_str().unwrap();
    // The harness's own plain connection is on the plain port; every other client came in
    // over TLS.
    list.lines()
        .filter(|line| !line.contains("cmd=client|list"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_over_tls_acquire_renew_release_and_notify() {
    let pki = TestPki::generate();
    let (server, url) = tls_server(&pki, false);
    let ttl = Duration::from_millis(300);
    let holder = builder(&url)
        .tls_ca_file(pki.ca())
        .watchdog_lease(ttl)
        .build()
        .unwrap();
    let waiter = builder(&url).tls_ca_file(pki.ca()).build().unwrap();
    // A missed notification would cost the waiter this long.
    raw::set_backoff_floor(&waiter, Duration::from_secs(30));

    let guard = Lock::new("tls").on(&holder).acquire().await.unwrap();
    let waiting = spawn_waiter(&waiter, "tls", Duration::from_secs(60));
    // Held across three renewal periods, with a waiter subscribed over TLS.
    tokio::time::sleep(ttl).await;
    assert!(guard.is_held());
    assert!(holder.stats().renewed >= 2, "{:?}", holder.stats());
    assert!(
        tls_clients(&server) >= 3,
        "holder, waiter and its subscription"
    );
    let released = Instant::now();
    assert_eq!(guard.release().await.unwrap(), Released::Released);
    let acquired = waiting.await.unwrap().unwrap();
    assert!(
        acquired - released < Duration::from_secs(5),
        "the waiter was woken by a notification over TLS: {:?}",
        acquired - released
    );
    assert_eq!(holder.inspect("tls").await.unwrap(), None);
    eprintln!(
        "TLS rediss://: acquired, renewed {} times, released; waiter woken {:?} after the release",
        holder.stats().renewed,
        acquired - released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_verifies_clients_accepts_a_signed_client_certificate() {
    let pki = TestPki::generate();
    let (_server, url) = tls_server(&pki, true);
    let with_cert = builder(&url)
        .tls_ca_file(pki.ca())
        .tls_client_auth_files(pki.client_cert(), pki.client_key())
        .build()
        .unwrap();
    Lock::new("mtls")
        .on(&with_cert)
        .run(async {})
        .await
        .expect("a client with a certificate signed by the CA");
    let without = builder(&url).tls_ca_file(pki.ca()).build().unwrap();
    let err = Lock::new("mtls").on(&without).acquire().await.unwrap_err();
    certain_backend_failure(&err);
    assert!(
        err.to_string()
            .contains("the server requires a client certificate; set `tls_client_auth_files`"),
        "{err}"
    );
    eprintln!("TLS client certificates: accepted with one; without: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_is_reported_as_a_certificate_problem() {
    let pki = TestPki::generate();
    let (_server, url) = tls_server(&pki, false);
    let wrong = builder(&url).tls_ca_file(pki.other_ca()).build().unwrap();
    let err = Lock::new("k").on(&wrong).acquire().await.unwrap_err();
    let text = err.to_string();
    certain_backend_failure(&err);
    assert!(
        text.contains("this is a TLS certificate problem"),
        "the error must say it is about the certificate: {text}"
    );
    assert!(text.contains("tls_ca_file"), "and what to set: {text}");
    // The web PKI roots do not know the test CA either.
    let default_roots = builder(&url).build().unwrap();
    let err = Lock::new("k")
        .on(&default_roots)
        .acquire()
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("this is a TLS certificate problem"),
        "{err}"
    );
    eprintln!("TLS wrong CA: {text}");
}

#[tokio::test]
async fn tls_settings_that_cannot_apply_are_errors() {
    let pki = TestPki::generate();
    let err = Backend::builder("redis://127.0.0.1:1")
        .tls_ca_file(pki.ca())
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("is not a rediss:// URL"), "{err}");
    let err = Backend::builder("memory://")
        .tls_ca_file(pki.ca())
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("in-process backend"), "{err}");
    let missing = pki.ca().with_file_name("nowhere.crt");
    let err = Backend::builder("rediss://127.0.0.1:1")
        .tls_ca_file(&missing)
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("tls_ca_file names"), "{err}");
    assert!(err.contains("nowhere.crt"), "{err}");
    let not_pem = pki.ca().with_file_name("server.ext");
    let err = Backend::builder("rediss://127.0.0.1:1")
        .tls_client_auth_files(&not_pem, pki.client_key())
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("holds no PEM block"), "{err}");
}

/// The only test of this binary that uses the `"default"` backend, built from the environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_configures_tls() {
    let pki = TestPki::generate();
    let (_server, url) = tls_server(&pki, true);
    std::env::set_var(distlock::env::URL, &url);
    std::env::set_var(distlock::env::PREFIX, PREFIX);
    std::env::set_var(distlock::env::TLS_CA_FILE, pki.ca());
    std::env::set_var(distlock::env::TLS_CERT_FILE, pki.client_cert());
    std::env::set_var(distlock::env::TLS_KEY_FILE, pki.client_key());
    let token = Lock::new("from-env")
        .run(async { distlock::fencing_token() })
        .await
        .expect("DISTLOCK_URL=rediss://… with DISTLOCK_TLS_* files");
    assert!(token.is_some());
    assert_eq!(Registry::global().get("default").unwrap().prefix(), PREFIX);
}
