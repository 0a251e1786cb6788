//! The floor, measured on the benchmark's own server in the same run: how many round trips per
//! second one connection gets (an uncontended lock cycle needs 2, so a sequential cycle cannot
//! beat half of it), and how many commands per second the server answers at the parallel
//! workload's concurrency.

use distlock_test_support::RedisServer;
use serde_json::{Map, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

/// Environment variable naming the `redis-benchmark` binary; without it, `PATH` is searched.
pub(crate) const REDIS_BENCHMARK_ENV: &str = "DISTLOCK_REDIS_BENCHMARK";

/// Every floor number of one run.
pub(crate) async fn measure(
    server: &RedisServer,
    requests: (u64, u64),
    tasks: usize,
    duration: Duration,
) -> Map<String, Value> {
    let mut floor = Map::new();
    let port = server.port();
    let (one, many) = requests;
    let benchmark_one = redis_benchmark_rate(port, 1, one).await;
    let raw = {
        let addr = server.addr();
        tokio::task::spawn_blocking(move || raw_set_loop(addr, duration))
            .await
            .expect("SET loop thread")
    };
    let benchmark_many = redis_benchmark_rate(port, tasks, many).await;
    let redis_rs_one = redis_rs_set_rate(&server.url(), 1, duration).await;
    let redis_rs_many = redis_rs_set_rate(&server.url(), tasks, duration).await;

    // The floor is redis-benchmark's; without it, the equivalent loop stands in.
    let (rtt, source) = match &benchmark_one {
        Ok(rate) => (*rate, "redis-benchmark -c 1 -t set".to_owned()),
        Err(why) => (raw, format!("raw SET loop on one connection ({why})")),
    };
    let (server_rate, server_source) = match &benchmark_many {
        Ok(rate) => (*rate, format!("redis-benchmark -c {tasks} -t set")),
        Err(why) => (
            redis_rs_many,
            format!("redis-rs SET, {tasks} tasks ({why})"),
        ),
    };
    floor.insert("rtt_set_per_s".into(), rtt.into());
    floor.insert("rtt_source".into(), source.into());
    floor.insert("sequential_cycle_floor".into(), (rtt / 2.0).into());
    floor.insert("raw_set_loop_per_s".into(), raw.into());
    floor.insert("redis_rs_set_per_s".into(), redis_rs_one.into());
    floor.insert("server_set_per_s_at_tasks".into(), server_rate.into());
    floor.insert("server_source".into(), server_source.into());
    floor.insert("parallel_cycle_floor".into(), (server_rate / 2.0).into());
    floor.insert("redis_rs_set_per_s_at_tasks".into(), redis_rs_many.into());
    floor
}

/// [`redis_benchmark`] off the runtime's threads.
pub(crate) async fn redis_benchmark_rate(
    port: u16,
    clients: usize,
    requests: u64,
) -> Result<f64, String> {
    tokio::task::spawn_blocking(move || redis_benchmark(port, clients, requests))
        .await
        .map_err(|e| format!("redis-benchmark thread: {e}"))?
}

/// `redis-benchmark -c <clients> -n <requests> -t set --csv` against our server: SET/s.
fn redis_benchmark(port: u16, clients: usize, requests: u64) -> Result<f64, String> {
    let binary = std::env::var_os(REDIS_BENCHMARK_ENV).unwrap_or_else(|| "redis-benchmark".into());
    let output = Command::new(&binary)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &clients.to_string(), "-n", &requests.to_string()])
        .args(["-t", "set", "--csv"])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", binary.to_string_lossy()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "redis-benchmark exited with {}: {stdout}",
            output.status
        ));
    }
    parse_benchmark_csv(&stdout).ok_or_else(|| format!("no SET line in {stdout:?}"))
}

/// `"SET","23474.18",…` → 23474.18.
fn parse_benchmark_csv(csv: &str) -> Option<f64> {
    csv.lines().find_map(|line| {
        let mut fields = line.split(',').map(|field| field.trim().trim_matches('"'));
        (fields.next()? == "SET").then_some(())?;
        fields.next()?.parse().ok()
    })
}

/// SET after SET on one blocking connection, the smallest client there is: what redis-benchmark
/// -c 1 measures, without redis-benchmark.
fn raw_set_loop(addr: std::net::SocketAddr, duration: Duration) -> f64 {
    const SET: &[u8] = b"*3\r\n$3\r\nSET\r\n$7\r\nfloor:k\r\n$1\r\nv\r\n";
    let mut stream = TcpStream::connect(addr).expect("connect for the SET loop");
    stream.set_nodelay(true).expect("TCP_NODELAY");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let mut reply = [0u8; 5];
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < duration {
        stream.write_all(SET).expect("SET loop write");
        stream.read_exact(&mut reply).expect("SET loop read");
        assert_eq!(&reply, b"+OK\r\n", "SET loop: unexpected reply");
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// SET/s through redis-rs's multiplexed connection (what the libraries sit on), with `tasks`
/// tasks sharing one connection.
async fn redis_rs_set_rate(url: &str, tasks: usize, duration: Duration) -> f64 {
    let client = redis::Client::open(url).expect("a valid URL");
    let connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis-rs connection");
    let start = Instant::now();
    let deadline = start + duration;
    let workers: Vec<_> = (0..tasks)
        .map(|i| {
            let mut connection = connection.clone();
            tokio::spawn(async move {
                let key = format!("floor:rs:{i}");
                let mut n = 0u64;
                while Instant::now() < deadline {
                    redis::cmd("SET")
                        .arg(&key)
                        .arg("v")
                        .query_async::<()>(&mut connection)
                        .await
                        .expect("redis-rs SET");
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for worker in workers {
        total += worker.await.expect("SET task");
    }
    total as f64 / start.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn benchmark_csv_gives_the_set_rate() {
        let csv = "\"test\",\"rps\",\"avg_latency_ms\"\n\"SET\",\"23474.18\",\"0.039\"\n";
        assert_eq!(parse_benchmark_csv(csv), Some(23474.18));
        assert_eq!(parse_benchmark_csv("garbage"), None);
    }
}
