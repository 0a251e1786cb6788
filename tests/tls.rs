//! TLS end to end: a redis-server with a TLS port and certificates made at test time, locks over
//! `rediss://` (acquire, watchdog renewal, release, release notifications), client certificates,
//! and the errors a wrong CA or a misplaced setting produce.

mod common;

use common::{certain_backend_failure, spawn_waiter, PREFIX};
use distlock::__private::raw;
use distlock::{Backend, BackendBuilder, Lock, Registry, Released};
use distlock_test_support::{
    free_port, EtcdCluster, MariaDbServer, PgServer, RedisServer, ServerCert, ServerConfig, TestPki,
};
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

/// Pings each case's backend, which must fail within `bound` with an error that contains the
/// case's named text; prints each error, for `store`.
async fn each_named<const N: usize>(
    store: &str,
    cases: [(&str, BackendBuilder, &str); N],
    bound: Duration,
) {
    for (case, builder, named) in cases {
        let started = Instant::now();
        let err = ping_fails(builder).await;
        assert!(err.contains(named), "{case}: {err}");
        assert!(
            started.elapsed() < bound,
            "{case}: took {:?}",
            started.elapsed()
        );
        eprintln!("TLS {store}, {case} ({:?}): {err}", started.elapsed());
    }
}

/// The message of a ping of `builder`'s backend, which fails.
async fn ping_fails(builder: BackendBuilder) -> String {
    let backend = builder.build().unwrap();
    let err = backend.ping().await.unwrap_err();
    assert!(matches!(err, distlock::LockError::Backend(_)), "{err:?}");
    err.to_string()
}

/// Mutual TLS to etcd: a client with the CA and a client certificate takes locks; each way of
/// getting TLS wrong fails at once, with an error that says which it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_mutual_tls_names_every_way_of_getting_tls_wrong() {
    let pki = TestPki::generate();
    let tls = EtcdCluster::start_tls(1, &pki);
    let plain = EtcdCluster::start(1);
    let expired = EtcdCluster::start_tls_presenting(1, &pki, ServerCert::Expired);
    let misnamed = EtcdCluster::start_tls_presenting(1, &pki, ServerCert::Misnamed);
    let with_files = |url: String| {
        builder(&url)
            .tls_ca_file(pki.ca())
            .tls_client_auth_files(pki.client_cert(), pki.client_key())
    };
    let good = with_files(tls.url()).build().unwrap();
    good.ping()
        .await
        .expect("mutual TLS with the CA and a client certificate");
    let token = Lock::new("etcds")
        .on(&good)
        .run(async { distlock::fencing_token() })
        .await
        .unwrap();
    assert!(token.is_some());

    let plain_url = tls.url().replace("etcds://", "etcd://");
    let cases = [
        (
            "no client certificate",
            builder(&tls.url()).tls_ca_file(pki.ca()),
            "set `tls_client_auth_files`",
        ),
        (
            "a CA that did not sign the server's certificate",
            with_files(tls.url()).tls_ca_file(pki.other_ca()),
            "is not signed by a CA the client trusts",
        ),
        (
            "an expired server certificate",
            with_files(expired.url()),
            "has expired",
        ),
        (
            "a server certificate for another host",
            with_files(misnamed.url()),
            "does not name the host in the URL",
        ),
        (
            "a plain member behind etcds://",
            with_files(plain.url().replace("etcd://", "etcds://")),
            "did not answer the TLS handshake",
        ),
        (
            "a TLS member behind etcd://",
            builder(&plain_url),
            "use an etcds:// URL",
        ),
    ];
    each_named("etcd", cases, Duration::from_secs(5)).await;
    // TLS files for a plain URL are refused when the backend is built.
    let err = with_files(plain.url()).build().unwrap_err().to_string();
    assert!(err.contains("use etcds://"), "{err}");
}

/// etcd with authentication: a user whose role may read and write the keys under the prefix
/// (what `distlock acl etcd` prints) takes locks; a user without it gets a ping error that says
/// which right is missing; a wrong password is named as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_user_limited_to_the_prefix_locks_and_one_without_the_role_is_told() {
    let pki = TestPki::generate();
    let cluster = EtcdCluster::start_tls(1, &pki);
    let keys = distlock::etcd::key_prefix(PREFIX);
    cluster.etcdctl_script(
        "etcdctl user add root:rootpw\n\
         etcdctl user grant-role root root\n\
         etcdctl user add locker:lockerpw\n\
         etcdctl user add stranger:strangerpw\n\
         etcdctl auth enable\n",
        None,
    );
    // What `distlock acl etcd --user locker` prints.
    let rights = distlock::etcd::acl_commands(PREFIX, "locker");
    cluster.etcdctl_script(&rights, Some("root:rootpw"));
    let as_user = |user: &str| {
        let url = cluster
            .url()
            .replace("etcds://", &format!("etcds://{user}@"));
        builder(&url)
            .tls_ca_file(pki.ca())
            .tls_client_auth_files(pki.client_cert(), pki.client_key())
    };
    let locker = as_user("locker:lockerpw").build().unwrap();
    locker.ping().await.expect("a user with the prefix's role");
    let guard = Lock::new("rbac").on(&locker).acquire().await.unwrap();
    assert!(guard.fencing_token() > 0);
    assert_eq!(guard.release().await.unwrap(), Released::Released);

    let err = ping_fails(as_user("stranger:strangerpw")).await;
    assert!(
        err.contains(&format!(
            "read and write on the keys that start with `{keys}`"
        )),
        "{err}"
    );
    assert!(err.contains("distlock acl etcd"), "{err}");
    let err = ping_fails(as_user("locker:wrong")).await;
    assert!(err.contains("rejected the credentials"), "{err}");
    assert!(!err.contains("wrong"), "the password is not shown: {err}");
    eprintln!("etcd RBAC: a user without the role: {err}");
}

/// Each way of getting TLS to Redis wrong fails at `ping()` at once, with an error that says
/// which it is: a server certificate that expired or names another host, a plain server behind
/// `rediss://`, a TLS-only port behind `redis://`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_names_every_way_of_getting_tls_wrong() {
    let pki = TestPki::generate();
    let presenting = |which| {
        let tls_port = free_port();
        let config = pki.serve_presenting(ServerConfig::new(), tls_port, false, which);
        (RedisServer::start_with(config), tls_port)
    };
    let (_expired, expired_port) = presenting(ServerCert::Expired);
    let (_misnamed, misnamed_port) = presenting(ServerCert::Misnamed);
    let (good, good_port) = presenting(ServerCert::Valid);
    let trusted = |url: String| builder(&url).tls_ca_file(pki.ca());
    let cases = [
        (
            "an expired server certificate",
            trusted(format!("rediss://127.0.0.1:{expired_port}")),
            "has expired",
        ),
        (
            "a server certificate for another host",
            trusted(format!("rediss://127.0.0.1:{misnamed_port}")),
            "does not name the host in the URL",
        ),
        (
            "a plain server behind rediss://",
            trusted(format!("rediss://127.0.0.1:{}", good.port())),
            "did not answer the TLS handshake",
        ),
        (
            "a TLS port behind redis://",
            builder(&format!("redis://127.0.0.1:{good_port}")),
            "use a rediss:// URL",
        ),
    ];
    // Never a hang: at most the three connection attempts' timeouts (2 s each).
    each_named("redis", cases, Duration::from_secs(10)).await;
}

/// `postgres://postgres@127.0.0.1:<port>/postgres?<query>` on `server`.
fn pg_url(server: &PgServer, user: &str, query: &str) -> String {
    format!(
        "postgres://{user}@127.0.0.1:{}/postgres?{query}",
        server.port()
    )
}

/// How a database's URL asks for TLS, and what its errors advise: the cases of
/// [`database_over_tls_names_every_way_of_getting_tls_wrong`].
struct TlsUrls {
    store: &'static str,
    /// `<scheme>://<user>@127.0.0.1:<port>/<database>?<query>` for a port and a query.
    url: fn(u16, &str) -> String,
    /// The query that verifies the server's certificate with the CA file given.
    verify: fn(&std::path::Path) -> String,
    /// The queries that demand TLS, and that refuse it.
    require: &'static str,
    disable: &'static str,
    /// What the errors of a CA not trusted, a plain server behind `require`, and a TLS-only
    /// server behind `disable` name.
    ca_named: &'static str,
    plain_named: &'static str,
    tls_only_named: &'static str,
}

/// A database over TLS, set as its own clients set it (in the URL): locks work against a server
/// that takes only TLS (on `ports[0]`), and each way of getting TLS wrong fails at `ping()` at
/// once, with an error that says which it is: the wrong CA, an expired server certificate
/// (`ports[1]`), one for another host (`ports[2]`), a plain server (`ports[3]`) behind a URL
/// that demands TLS, and the TLS-only server behind one that refuses it.
async fn database_over_tls_names_every_way_of_getting_tls_wrong(
    urls: TlsUrls,
    pki: &TestPki,
    ports: [u16; 4],
) {
    let [tls, expired, misnamed, plain] = ports;
    let good = Backend::builder((urls.url)(tls, &(urls.verify)(&pki.ca())))
        .prefix(PREFIX)
        .create_schema(true)
        .build()
        .unwrap();
    good.ping().await.expect("TLS with the CA");
    let token = Lock::new(format!("{}-tls", urls.store))
        .on(&good)
        .run(async { distlock::fencing_token() })
        .await
        .unwrap();
    assert!(token.is_some());
    let require = format!("a plain server behind {}", urls.require);
    let disable = format!("a TLS-only server behind {}", urls.disable);
    let cases = [
        (
            "a CA that did not sign the server's certificate",
            (urls.url)(tls, &(urls.verify)(&pki.other_ca())),
            urls.ca_named,
        ),
        (
            "an expired server certificate",
            (urls.url)(expired, &(urls.verify)(&pki.ca())),
            "has expired",
        ),
        (
            "a server certificate for another host",
            (urls.url)(misnamed, &(urls.verify)(&pki.ca())),
            "does not name the host in the URL",
        ),
        (
            require.as_str(),
            (urls.url)(plain, urls.require),
            urls.plain_named,
        ),
        (
            disable.as_str(),
            (urls.url)(tls, urls.disable),
            urls.tls_only_named,
        ),
    ];
    let cases = cases.map(|(case, url, named)| (case, Backend::builder(url).prefix(PREFIX), named));
    each_named(urls.store, cases, Duration::from_secs(5)).await;
}

/// PostgreSQL over TLS (`hostssl` only), set as libpq sets it: `sslmode` and `sslrootcert`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_names_every_way_of_getting_tls_wrong() {
    let pki = TestPki::generate();
    let servers = [
        PgServer::start_tls(&pki, ServerCert::Valid),
        PgServer::start_tls(&pki, ServerCert::Expired),
        PgServer::start_tls(&pki, ServerCert::Misnamed),
        PgServer::start(),
    ];
    let urls = TlsUrls {
        store: "postgres",
        url: |port, query| format!("postgres://postgres@127.0.0.1:{port}/postgres?{query}"),
        verify: |ca| format!("sslmode=verify-full&sslrootcert={}", ca.display()),
        require: "sslmode=require",
        disable: "sslmode=disable",
        ca_named: "is not signed by a CA the client trusts; set `sslrootcert`",
        plain_named: "a server without TLS takes `sslmode=disable`",
        tls_only_named: "the server takes only TLS connections from this host",
    };
    let ports = servers.each_ref().map(PgServer::port);
    database_over_tls_names_every_way_of_getting_tls_wrong(urls, &pki, ports).await;
}

/// A PostgreSQL role with exactly the GRANTs `distlock acl postgres` prints takes locks (over
/// TLS); a role without them gets a ping error that says which right is missing and what
/// prints the GRANTs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_role_with_the_printed_grants_locks_and_one_without_is_told() {
    let pki = TestPki::generate();
    let server = PgServer::start_tls(&pki, ServerCert::Valid);
    server.psql(&distlock::postgres::schema("distlock").unwrap());
    server.psql("CREATE ROLE locker LOGIN; CREATE ROLE stranger LOGIN;");
    server.psql(&distlock::postgres::grants("distlock", "locker").unwrap());
    let query = format!("sslmode=verify-full&sslrootcert={}", pki.ca().display());
    let locker = Backend::builder(pg_url(&server, "locker", &query))
        .prefix(PREFIX)
        .build()
        .unwrap();
    locker.ping().await.expect("a role with the printed GRANTs");
    let guard = Lock::new("pg-rights").on(&locker).acquire().await.unwrap();
    assert!(guard.fencing_token() > 0);
    assert_eq!(guard.release().await.unwrap(), Released::Released);
    let err =
        ping_fails(Backend::builder(pg_url(&server, "stranger", &query)).prefix(PREFIX)).await;
    assert!(err.contains("permission denied"), "{err}");
    assert!(
        err.contains("distlock acl postgres --schema distlock --user <user>"),
        "{err}"
    );
    eprintln!("postgres grants: a role without them: {err}");
}

/// MySQL over TLS (a MariaDB server with `require_secure_transport`), set as sqlx's MySQL
/// client sets it: `ssl-mode` and `ssl-ca`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_over_tls_names_every_way_of_getting_tls_wrong() {
    let pki = TestPki::generate();
    let servers = [
        MariaDbServer::start_tls(&pki, ServerCert::Valid),
        MariaDbServer::start_tls(&pki, ServerCert::Expired),
        MariaDbServer::start_tls(&pki, ServerCert::Misnamed),
        MariaDbServer::start_with(&["--skip-ssl"]),
    ];
    let urls = TlsUrls {
        store: "mysql",
        url: |port, query| format!("mysql://root@127.0.0.1:{port}/test?{query}"),
        verify: |ca| format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={}", ca.display()),
        require: "ssl-mode=REQUIRED",
        disable: "ssl-mode=DISABLED",
        ca_named: "is not signed by a CA the client trusts; set `ssl-ca`",
        plain_named: "a server without TLS takes `ssl-mode=DISABLED`",
        tls_only_named: "takes only TLS connections",
    };
    let ports = servers.each_ref().map(MariaDbServer::port);
    database_over_tls_names_every_way_of_getting_tls_wrong(urls, &pki, ports).await;
}
