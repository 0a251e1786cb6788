//! The `axum_service` example's bank (`distlock_examples::bank`), driven over real HTTP with its
//! locks on a real redis-server: concurrent deposits and transfers keep every unit, and each lock
//! outcome reaches the client as its status.
//!
//! One test in phases, not one test per status: the handlers lock on the process-wide `"default"`
//! backend, which can be registered once, and the last phase stops its server.

use distlock::{Backend, Lease, Lock, Registry, DEFAULT_BACKEND};
use distlock_examples::bank::{self, Account, Ledger};
use distlock_test_support::RedisServer;
use futures_util::future::join_all;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Upper bound for one request, on a loaded CI machine; the deposits and transfers wait up to
/// 5 s for their locks.
const REQUEST_DEADLINE: Duration = Duration::from_secs(30);
/// Deposits of `DEPOSIT` into each of the accounts 1, 2 and 3, all at once.
const DEPOSITS_PER_ACCOUNT: u64 = 30;
const DEPOSIT: u64 = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bank_over_http() {
    let mut server = RedisServer::start();
    let backend = Backend::builder(server.url()).build().unwrap();
    Registry::global()
        .register(DEFAULT_BACKEND, backend.clone())
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let bank = Client {
        addr: listener.local_addr().unwrap(),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(bank::serve_until(listener, Ledger::default(), async {
        let _ = stopped.await;
    }));

    let ready = bank.call("GET", "/ready", None).await;
    assert_eq!(
        (ready.status, ready.body.as_str()),
        (200, "ready"),
        "{ready:?}"
    );
    concurrent_deposits_and_transfers_keep_every_unit(&bank).await;
    // The holder is another client of the same server (another instance of the service, in
    // effect), so the handler's refusal comes from the server, with the holder's TTL.
    let other_instance = Backend::builder(server.url()).build().unwrap();
    a_busy_account_is_409_with_retry_after(&bank, &other_instance).await;
    requests_that_cannot_be_carried_out_are_rejected(&bank).await;
    a_backend_that_is_down_is_503(&bank, &mut server).await;
    server.restart();
    let observer = Backend::builder(server.url()).build().unwrap();
    shuts_down_gracefully_and_frees_its_locks(&bank, &observer, stop, serving).await;
}

/// Stopping the service: it stops serving, and the locks the process still held (here a
/// background job's, on the service's `"default"` backend) are free at once, not after their
/// 30 s TTL; the backend takes no new locks.
async fn shuts_down_gracefully_and_frees_its_locks(
    bank: &Client,
    observer: &Backend,
    stop: tokio::sync::oneshot::Sender<()>,
    serving: tokio::task::JoinHandle<std::io::Result<()>>,
) {
    // (The acquire retries through the reconnection the server's restart needs.)
    let job = Lock::new("job:nightly").acquire().await.unwrap();
    let ready = bank.call("GET", "/ready", None).await;
    assert_eq!(ready.status, 200, "{ready:?}");
    let started = std::time::Instant::now();
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), serving)
        .await
        .expect("the service did not stop")
        .unwrap()
        .unwrap();
    let took = started.elapsed();
    assert_eq!(observer.inspect("job:nightly").await.unwrap(), None);
    assert!(!job.is_held());
    let refused = Lock::new("job:next").acquire().await.unwrap_err();
    assert!(
        matches!(refused, distlock::LockError::ShutDown { .. }),
        "{refused:?}"
    );
    assert!(
        TcpStream::connect(bank.addr).await.is_err(),
        "still serving"
    );
    eprintln!("graceful shutdown: stopped in {took:?}, the job's lock freed at once");
}

/// Every deposit and transfer waits its turn and succeeds; the balances are exact. Without the
/// locks, two requests that read a balance across the ledger's latency both write their own
/// update, and one is lost: the balances come out short (and their sum too).
async fn concurrent_deposits_and_transfers_keep_every_unit(bank: &Client) {
    let deposit = format!(r#"{{"amount": {DEPOSIT}}}"#);
    let deposits = (0..DEPOSITS_PER_ACCOUNT)
        .flat_map(|_| [1, 2, 3])
        .map(|id| bank.deposit(id, &deposit));
    for reply in join_all(deposits).await {
        assert_eq!(reply.status, 200, "deposit: {reply:?}");
    }
    let opening = DEPOSITS_PER_ACCOUNT * DEPOSIT;
    assert_eq!(bank.balances().await, [opening; 3], "after the deposits");

    // A cycle 1 → 2 → 3 → 1: transfers that took their two locks in their own order could each
    // hold one and wait for the other until their budget ran out (409). No account can run
    // short, in whatever order they run.
    let transfers = [(1, 2, 7, 20), (2, 3, 3, 20), (3, 1, 2, 10)]
        .into_iter()
        .flat_map(|(from, to, amount, times)| {
            (0..times)
                .map(move |_| format!(r#"{{"from": {from}, "to": {to}, "amount": {amount}}}"#))
        })
        .collect::<Vec<_>>();
    for reply in join_all(transfers.iter().map(|body| bank.transfer(body))).await {
        assert_eq!(reply.status, 200, "transfer: {reply:?}");
    }
    let expected = [
        opening - 20 * 7 + 10 * 2,
        opening + 20 * 7 - 20 * 3,
        opening + 20 * 3 - 10 * 2,
    ];
    let balances = bank.balances().await;
    assert_eq!(balances, expected, "after the transfers");
    assert_eq!(balances.iter().sum::<u64>(), 3 * opening);
}

/// `DELETE` does not wait: while another instance holds `account:1` — the key the handler renders
/// from its path — closing the account is refused, and nothing changes. Its `Retry-After` is the
/// holder's remaining lease as the server reported it, rounded up to whole seconds: here a fixed
/// 7 s lease, so 7 (6 if a second passed since it was granted), never a constant.
async fn a_busy_account_is_409_with_retry_after(bank: &Client, backend: &Backend) {
    let before = bank.account(1).await;
    let held = Lock::new("account:1")
        .on(backend)
        .lease(Lease::Fixed(Duration::from_secs(7)))
        .acquire()
        .await
        .unwrap();
    let reply = bank.call("DELETE", "/accounts/1", None).await;
    assert_eq!(reply.status, 409, "{reply:?}");
    let retry_after: u64 = reply
        .header("retry-after")
        .unwrap_or_else(|| panic!("a 409 without Retry-After: {reply:?}"))
        .parse()
        .expect("Retry-After in whole seconds");
    assert!(
        (6..=7).contains(&retry_after),
        "Retry-After: {retry_after}, for a holder with a 7 s lease"
    );
    held.release().await.unwrap();
    assert_eq!(
        bank.account(1).await,
        before,
        "a refused close changed the account"
    );
}

/// 422 for what the bank refuses (an overdraft, a transfer to the same account) and for what
/// axum's `Json` extractor cannot deserialize (a zero or negative amount); 400, axum's answer,
/// for a body that is not JSON. None of them changes a balance.
async fn requests_that_cannot_be_carried_out_are_rejected(bank: &Client) {
    let before = bank.balances().await;
    let overdraft = format!(r#"{{"from": 1, "to": 2, "amount": {}}}"#, before[0] + 1);
    let rejected = [
        (bank.transfer(&overdraft).await, 422),
        (
            bank.transfer(r#"{"from": 2, "to": 2, "amount": 1}"#).await,
            422,
        ),
        (bank.deposit(1, r#"{"amount": -5}"#).await, 422),
        (bank.deposit(1, r#"{"amount": 0}"#).await, 422),
        (bank.deposit(1, r#"{"amount": "#).await, 400),
    ];
    for (reply, status) in rejected {
        assert_eq!(reply.status, status, "{reply:?}");
    }
    assert_eq!(bank.balances().await, before);
}

/// With the lock server gone, a locked request fails as unavailable and changes nothing; the
/// unlocked balance read still answers. (`DELETE`, which does not wait: a deposit would retry
/// for its whole 5 s wait budget before answering the same 503.)
async fn a_backend_that_is_down_is_503(bank: &Client, server: &mut RedisServer) {
    let before = bank.account(2).await;
    server.stop();
    let reply = bank.call("DELETE", "/accounts/2", None).await;
    assert_eq!(reply.status, 503, "{reply:?}");
    assert_eq!(bank.account(2).await, before);
    // And the instance says it is not ready, with why.
    let ready = bank.call("GET", "/ready", None).await;
    assert_eq!(ready.status, 503, "{ready:?}");
    assert!(ready.body.contains("failed during ping"), "{ready:?}");
}

/// An HTTP/1.1 client for the bank: one connection per request (`Connection: close`), read to
/// its end. The bank's bodies have a known length, so they are never chunked.
struct Client {
    addr: SocketAddr,
}

#[derive(Debug)]
struct Reply {
    status: u16,
    /// Names in lower case.
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(header, _)| header == name)
            .map(|(_, value)| value.as_str())
    }
}

impl Client {
    async fn call(&self, method: &str, path: &str, json: Option<&str>) -> Reply {
        let exchange = async {
            let mut stream = TcpStream::connect(self.addr).await?;
            let mut request = format!(
                "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
                self.addr
            );
            if let Some(json) = json {
                request += &format!(
                    "Content-Type: application/json\r\nContent-Length: {}\r\n",
                    json.len()
                );
            }
            request += "\r\n";
            request += json.unwrap_or("");
            stream.write_all(request.as_bytes()).await?;
            let mut response = String::new();
            stream.read_to_string(&mut response).await?;
            Ok::<_, std::io::Error>(response)
        };
        let response = tokio::time::timeout(REQUEST_DEADLINE, exchange)
            .await
            .unwrap_or_else(|_| panic!("{method} {path}: no response within {REQUEST_DEADLINE:?}"))
            .unwrap_or_else(|err| panic!("{method} {path}: {err}"));
        parse(&response)
            .unwrap_or_else(|| panic!("{method} {path}: not an HTTP response: {response:?}"))
    }

    async fn deposit(&self, id: u64, json: &str) -> Reply {
        self.call("POST", &format!("/accounts/{id}/deposit"), Some(json))
            .await
    }

    async fn transfer(&self, json: &str) -> Reply {
        self.call("POST", "/transfers", Some(json)).await
    }

    async fn account(&self, id: u64) -> Account {
        let reply = self.call("GET", &format!("/accounts/{id}"), None).await;
        assert_eq!(reply.status, 200, "{reply:?}");
        let account: Account =
            serde_json::from_str(&reply.body).unwrap_or_else(|err| panic!("{err}: {reply:?}"));
        assert_eq!(account.id, id);
        account
    }

    /// Accounts 1, 2 and 3.
    async fn balances(&self) -> [u64; 3] {
        let mut balances = [0; 3];
        for (id, balance) in (1..).zip(&mut balances) {
            *balance = self.account(id).await.balance;
        }
        balances
    }
}

fn parse(response: &str) -> Option<Reply> {
    let (head, body) = response.split_once("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()?
        .strip_prefix("HTTP/1.1 ")?
        .get(..3)?
        .parse()
        .ok()?;
    let headers = lines
        .map(|line| {
            let (name, value) = line.split_once(':')?;
            Some((name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        })
        .collect::<Option<_>>()?;
    Some(Reply {
        status,
        headers,
        body: body.to_owned(),
    })
}
