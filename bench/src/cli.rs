//! Command-line arguments: the benchmark run (the default), `--help`, and the hidden `--worker`
//! mode the multi-process contended workloads re-execute this binary in.

use crate::clients::LibId;
use crate::pin::Pin;
use crate::workloads::counts::CountArgs;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

pub(crate) const HELP: &str = "\
distlock-bench: distlock beside the crates.io peers rslock and redlock, on the same Redis, in one run

USAGE:
    cargo run --release -p distlock-bench -- [OPTIONS]

Starts its own redis-server on 127.0.0.1 (a free port and a temp dir; never the machine's 6379),
measures the round-trip floor on it (redis-benchmark -c 1 / -c 64 -t set, plus an equivalent SET
loop), then runs every workload for every library against that server and prints a table of the
medians over --runs repetitions, followed by one JSON line (the last line of stdout).

WORKLOADS:
    sequential   1 task, acquire + release of distinct keys: cycles/s, p50/p99, ratio to the floor
    parallel     --tasks tasks on distinct keys: cycles/s, ratio to the server's rate at that concurrency
    contended    --contenders tasks on one key, --contenders independent clients (a backend
                 and connections each, one task each), 2 processes x (contenders/2) tasks, and
                 12 tasks as 3 processes x 4 and as 6 x 2: critical sections/s, fairness per worker and
                 per process, handoff and wait latency, Redis commands per acquired lock;
                 beside the libraries, the FIFO floor (`fifo-floor`): waiters queued on the
                 server and the lock granted to the next one inside the release, by one message —
                 no lease, fencing or ownership check, so no FIFO lock through the server hands
                 over for less
    held         --leases leases held at once: renewal calls, Redis CPU and client CPU per period
    attribute    #[distributed_lock] against the programmatic API on the in-process backend, in ns
    redlock      Redlock over --masters servers of their own: distlock's Redlock engine beside
                 rslock's and redlock's multi-server modes, sequential and --contenders tasks on
                 one key: cycles/s, critical sections/s, fairness, timeouts
    replicated   a primary with one replica of their own: distlock with min_replicas(1) (every
                 grant acknowledged by the replica, WAIT in the same round trip) beside itself
                 without and the peers (which do not wait): cycles/s, p50, the price of WAIT
    open         open loop: Poisson arrivals at 25, 50, 75 and 90 % of rslock's closed-loop
                 capacity for the same request with --tasks tasks (measured in the same run),
                 each request acquire + GET + release, on uniform keys (100,000) and Zipf keys (s = 1.1, 1,000):
                 achieved rate, latency from the scheduled arrival (p50/p99/p99.9), timeouts
                 (1 s), overlapping holds
    etcd         a 3-member etcd cluster of its own: distlock's etcd engine beside etcd's own lock
                 service (Lock/Unlock through etcd-client, on a session lease), sequential and
                 --contenders tasks on one key: cycles/s, critical sections/s, fairness, worst wait
    postgres     a PostgreSQL server of its own (fsync off): distlock's PostgreSQL engine beside
                 distributed-lock-postgres 0.2.0 (session advisory locks), sequential and
                 --contenders tasks on one key: cycles/s, critical sections/s, fairness, worst
                 wait, client and server CPU per cycle
    mysql        a MariaDB server of its own (commits not flushed to the disk): distlock's MySQL
                 engine beside distributed-lock-mysql 0.2.0 (GET_LOCK user-level locks),
                 sequential and --contenders tasks on one key: cycles/s, critical sections/s,
                 fairness, worst wait, client and server CPU per cycle
    zookeeper    a 3-server ZooKeeper ensemble of its own: distlock's ZooKeeper engine beside
                 zookeeper-client 0.11.2's own lock recipe (Client::lock, Curator's node names),
                 sequential and --contenders tasks on one key, each task with a session of its
                 own: cycles/s, critical sections/s, fairness, worst wait, client and server CPU
                 per cycle
    counts       one uncontended cycle counted, not timed, in child processes of this binary:
                 client instructions (valgrind --tool=callgrind, 1,500 cycles less 500), context
                 switches (/proc, 5,000 cycles) and Redis commands and µs (INFO commandstats) for
                 distlock, distlock-fixed, distlock-unfenced, rslock and the redis-rs floor (SET NX PX and a
                 compare-and-delete script by hand); needs valgrind

OPTIONS:
    --smoke              finish in a few seconds (tiny sizes, one run): checks that the benchmark
                         works; its numbers mean nothing
    --runs N             repetitions of every measurement; the table shows medians [default: 3]
    --duration SECS      length of each timed phase [default: 2]
    --slices N           the sequential and parallel phases are cut into N slices, the libraries
                         taking turns, each slice with a fresh floor [default: 8]; the contended
                         phases into N/4 slices (at least 1)
    --only LIST          workloads to run, comma-separated [default: all]
    --libs LIST          distlock,distlock-fixed,distlock-unfenced,rslock,redlock [default: all]
    --tasks N            tasks of the parallel workload [default: 64]
    --contenders N       tasks of the one-process contended workload (even) [default: 8]
    --cs-us N            critical-section length in microseconds, busy work [default: 10]
    --leases N           leases of the held-leases workload [default: 10000]
    --masters N          Redis masters of the redlock workload [default: 5]
    --lease-ttl-ms N     lease TTL of the held-leases workload [default: 3000]
    --server KIND        redis (redis-server, or DISTLOCK_REDIS_SERVER) or valkey (valkey-server,
                         or DISTLOCK_VALKEY_SERVER: Valkey >= 8.1 has SET ... IFEQ, which distlock
                         releases with instead of a script) [default: redis]
    --pin MODE           where client and servers run: none (the scheduler's choice), split
                         (servers on CPU 0, this process and its children on CPU 1: every
                         message crosses between CPUs, the slow floor) or shared (all on CPU 0:
                         no cross-CPU wake-ups, the fastest floor); needs `taskset`
                         [default: none]
    --json-only          print only the JSON line
    --svg DIR            also draw the run as DIR/throughput.svg, DIR/waits.svg and
                         DIR/open-loop.svg
    --plot FILE          draw nothing new: read a saved JSON line from FILE and write its
                         pictures to the --svg DIR (default: the current directory)
    -h, --help           print this help

Library variants: `distlock` uses the default watchdog lease (what #[distributed_lock] uses),
`distlock-fixed` a fixed 10 s lease (no watchdog registration), `distlock-unfenced` efficiency
locks (fencing_tokens(false), the watchdog lease), the peers a 10 s TTL.
See BENCHMARKS.md for what every number means.
";

/// Workloads, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Workload {
    Sequential,
    Parallel,
    Contended,
    Held,
    Attribute,
    Redlock,
    Replicated,
    Etcd,
    OpenLoop,
    Postgres,
    Mysql,
    Zookeeper,
    Counts,
}

impl Workload {
    pub(crate) const ALL: [Workload; 13] = [
        Workload::Sequential,
        Workload::Parallel,
        Workload::Contended,
        Workload::Held,
        Workload::Attribute,
        Workload::Redlock,
        Workload::Replicated,
        Workload::Etcd,
        Workload::OpenLoop,
        Workload::Postgres,
        Workload::Mysql,
        Workload::Zookeeper,
        Workload::Counts,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::Sequential => "sequential",
            Workload::Parallel => "parallel",
            Workload::Contended => "contended",
            Workload::Held => "held",
            Workload::Attribute => "attribute",
            Workload::Redlock => "redlock",
            Workload::Replicated => "replicated",
            Workload::Etcd => "etcd",
            Workload::OpenLoop => "open",
            Workload::Postgres => "postgres",
            Workload::Mysql => "mysql",
            Workload::Zookeeper => "zookeeper",
            Workload::Counts => "counts",
        }
    }
}

/// Settings of one benchmark run.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) smoke: bool,
    pub(crate) runs: usize,
    pub(crate) duration: Duration,
    pub(crate) slices: usize,
    pub(crate) contended_slices: usize,
    pub(crate) workloads: Vec<Workload>,
    pub(crate) libs: Vec<LibId>,
    pub(crate) tasks: usize,
    pub(crate) contenders: usize,
    pub(crate) critical_section: Duration,
    pub(crate) leases: usize,
    pub(crate) lease_ttl: Duration,
    /// Masters of the Redlock workload.
    pub(crate) masters: usize,
    /// redis-benchmark requests at one connection, and at `tasks` connections.
    pub(crate) floor_requests: (u64, u64),
    /// Attribute workload: rounds × calls per round and variant.
    pub(crate) attribute_rounds: (usize, usize),
    pub(crate) json_only: bool,
    /// Where to draw the run's pictures, if anywhere.
    pub(crate) svg_dir: Option<PathBuf>,
    /// Every server of the run is a Valkey (`--server valkey`) instead of a redis-server.
    pub(crate) valkey: bool,
    /// Where the client and the servers run (`--pin`).
    pub(crate) pin: Pin,
}

impl Config {
    fn defaults() -> Config {
        Config {
            smoke: false,
            runs: 3,
            duration: Duration::from_secs(2),
            slices: 8,
            contended_slices: 2,
            workloads: Workload::ALL.to_vec(),
            libs: LibId::ALL.to_vec(),
            tasks: 64,
            contenders: 8,
            critical_section: Duration::from_micros(10),
            leases: 10_000,
            lease_ttl: Duration::from_millis(3000),
            masters: 5,
            floor_requests: (20_000, 150_000),
            attribute_rounds: (15, 20_000),
            json_only: false,
            svg_dir: None,
            valkey: false,
            pin: Pin::None,
        }
    }

    /// `--smoke`: every workload once, at sizes that finish in seconds.
    fn smoke(mut self) -> Config {
        self.smoke = true;
        self.runs = 1;
        self.duration = Duration::from_millis(150);
        self.slices = 1;
        self.contended_slices = 1;
        self.leases = 300;
        self.lease_ttl = Duration::from_millis(600);
        self.floor_requests = (2_000, 5_000);
        self.attribute_rounds = (3, 500);
        self
    }
}

/// The child side of the multi-process contended workloads.
#[derive(Debug, Clone)]
pub(crate) struct WorkerArgs {
    pub(crate) lib: LibId,
    pub(crate) url: String,
    pub(crate) key: String,
    pub(crate) tasks: usize,
    pub(crate) first_worker: usize,
    pub(crate) duration: Duration,
    pub(crate) critical_section: Duration,
}

impl WorkerArgs {
    /// The arguments that make [`parse`] produce `self` again in the child process.
    pub(crate) fn to_args(&self) -> Vec<String> {
        vec![
            "--worker".into(),
            "contended".into(),
            "--lib".into(),
            self.lib.name().into(),
            "--url".into(),
            self.url.clone(),
            "--key".into(),
            self.key.clone(),
            "--tasks".into(),
            self.tasks.to_string(),
            "--first-worker".into(),
            self.first_worker.to_string(),
            "--duration-us".into(),
            self.duration.as_micros().to_string(),
            "--cs-us".into(),
            self.critical_section.as_micros().to_string(),
        ]
    }
}

#[derive(Debug)]
pub(crate) enum Mode {
    Help,
    Run(Config),
    Worker(WorkerArgs),
    /// A child of the counts workload.
    Count(CountArgs),
    /// Redraw the pictures of a saved JSON line.
    Plot {
        from: PathBuf,
        to: PathBuf,
    },
}

pub(crate) fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Mode, String> {
    let args: Vec<String> = args
        .into_iter()
        .map(|arg| {
            arg.into_string()
                .map_err(|arg| format!("argument {arg:?} is not UTF-8"))
        })
        .collect::<Result<_, _>>()?;
    if args.first().map(String::as_str) == Some("--worker") {
        return parse_worker(&args[1..]).map(Mode::Worker);
    }
    if args.first().map(String::as_str) == Some("--count") {
        return parse_count(&args[1..]).map(Mode::Count);
    }
    if args.iter().any(|arg| arg == "--smoke") {
        return parse_run(&args, Config::defaults().smoke());
    }
    parse_run(&args, Config::defaults())
}

fn parse_run(args: &[String], mut config: Config) -> Result<Mode, String> {
    let mut plot_from: Option<PathBuf> = None;
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("`{flag}` needs a value; see --help"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Mode::Help),
            "--smoke" => {}
            "--json-only" => config.json_only = true,
            "--svg" => config.svg_dir = Some(PathBuf::from(value()?)),
            "--plot" => plot_from = Some(PathBuf::from(value()?)),
            "--runs" => config.runs = positive(flag, value()?)?,
            "--slices" => {
                config.slices = positive(flag, value()?)?;
                config.contended_slices = (config.slices / 4).max(1);
            }
            "--duration" => {
                let secs: f64 = number(flag, value()?)?;
                if !(secs > 0.0 && secs <= 600.0) {
                    return Err(format!("`--duration` is {secs}; expected seconds in (0, 600]"));
                }
                config.duration = Duration::from_secs_f64(secs);
            }
            "--only" => {
                config.workloads = list(value()?, |name| {
                    Workload::ALL.into_iter().find(|w| w.name() == name)
                })
                .map_err(|name| {
                    format!(
                        "unknown workload `{name}`; expected sequential, parallel, contended, held, attribute, redlock, replicated, etcd, open, postgres, mysql, zookeeper, counts"
                    )
                })?
            }
            "--libs" => {
                config.libs = list(value()?, LibId::from_name).map_err(|name| {
                    format!("unknown library `{name}`; expected distlock, distlock-fixed, rslock, redlock")
                })?
            }
            "--tasks" => config.tasks = positive(flag, value()?)?,
            "--contenders" => {
                config.contenders = positive(flag, value()?)?;
                if config.contenders < 2 || !config.contenders.is_multiple_of(2) {
                    return Err(format!(
                        "`--contenders` is {}; expected an even number of at least 2 (it is split over 2 processes)",
                        config.contenders
                    ));
                }
            }
            "--cs-us" => config.critical_section = Duration::from_micros(number(flag, value()?)?),
            "--leases" => config.leases = positive(flag, value()?)?,
            "--masters" => {
                let masters = positive(flag, value()?)?;
                if masters < 3 {
                    return Err(format!(
                        "`--masters` is {masters}; Redlock needs at least 3 masters (3 or 5)"
                    ));
                }
                config.masters = masters;
            }
            "--lease-ttl-ms" => {
                let ms: u64 = number(flag, value()?)?;
                if ms < 300 {
                    return Err(format!(
                        "`--lease-ttl-ms` is {ms}; expected at least 300 (rslock extends 500 ms before expiry at most)"
                    ));
                }
                config.lease_ttl = Duration::from_millis(ms);
            }
            "--server" => {
                config.valkey = match value()?.as_str() {
                    "redis" => false,
                    "valkey" => true,
                    other => {
                        return Err(format!(
                            "`--server` is `{other}`; expected `redis` or `valkey`"
                        ))
                    }
                }
            }
            "--pin" => {
                let mode = value()?;
                config.pin = Pin::from_name(mode).ok_or_else(|| {
                    format!("`--pin` is `{mode}`; expected `none`, `split` or `shared`")
                })?
            }
            other => return Err(format!("unknown argument `{other}`; see --help")),
        }
    }
    if let Some(from) = plot_from {
        let to = config.svg_dir.unwrap_or_else(|| PathBuf::from("."));
        return Ok(Mode::Plot { from, to });
    }
    Ok(Mode::Run(config))
}

fn parse_worker(args: &[String]) -> Result<WorkerArgs, String> {
    let mut worker = WorkerArgs {
        lib: LibId::Distlock,
        url: String::new(),
        key: String::new(),
        tasks: 1,
        first_worker: 0,
        duration: Duration::from_secs(1),
        critical_section: Duration::ZERO,
    };
    let mut args = args.iter();
    if args.next().map(String::as_str) != Some("contended") {
        return Err("--worker supports only `contended`".into());
    }
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| format!("worker: `{flag}` needs a value"))?;
        match flag.as_str() {
            "--lib" => {
                worker.lib = LibId::for_worker(value)
                    .ok_or_else(|| format!("worker: unknown library `{value}`"))?
            }
            "--url" => worker.url = value.clone(),
            "--key" => worker.key = value.clone(),
            "--tasks" => worker.tasks = positive(flag, value)?,
            "--first-worker" => worker.first_worker = number(flag, value)?,
            "--duration-us" => worker.duration = Duration::from_micros(number(flag, value)?),
            "--cs-us" => worker.critical_section = Duration::from_micros(number(flag, value)?),
            other => return Err(format!("worker: unknown argument `{other}`")),
        }
    }
    if worker.url.is_empty() || worker.key.is_empty() {
        return Err("worker: --url and --key are required".into());
    }
    Ok(worker)
}

fn parse_count(args: &[String]) -> Result<CountArgs, String> {
    let mut count = CountArgs {
        lib: LibId::Distlock,
        url: String::new(),
        cycles: 0,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| format!("count: `{flag}` needs a value"))?;
        match flag.as_str() {
            "--lib" => {
                count.lib = LibId::for_worker(value)
                    .ok_or_else(|| format!("count: unknown library `{value}`"))?
            }
            "--url" => count.url = value.clone(),
            "--cycles" => count.cycles = positive(flag, value)? as u64,
            other => return Err(format!("count: unknown argument `{other}`")),
        }
    }
    if count.url.is_empty() || count.cycles == 0 {
        return Err("count: --url and --cycles are required".into());
    }
    Ok(count)
}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("`{flag}` expects a number, got `{value}`"))
}

fn positive(flag: &str, value: &str) -> Result<usize, String> {
    match number(flag, value)? {
        0 => Err(format!("`{flag}` must be at least 1")),
        n => Ok(n),
    }
}

/// A comma-separated list; `Err` carries the first unknown name.
fn list<T>(value: &str, find: impl Fn(&str) -> Option<T>) -> Result<Vec<T>, String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(|name| find(name).ok_or_else(|| name.to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Config, String> {
        match parse(args.iter().map(OsString::from))? {
            Mode::Run(config) => Ok(config),
            other => panic!("expected a run, got {other:?}"),
        }
    }

    #[test]
    fn smoke_shrinks_everything_and_later_flags_still_apply() {
        let config = run(&["--runs", "2", "--smoke"]).unwrap();
        assert!(config.smoke);
        assert_eq!(
            config.runs, 2,
            "an explicit --runs wins over --smoke's default"
        );
        assert!(config.duration < Duration::from_secs(1));
    }

    #[test]
    fn unknown_names_are_reported_with_what_is_accepted() {
        let err = run(&["--only", "sequential,nope"]).unwrap_err();
        assert!(err.contains("`nope`"), "{err}");
        for workload in Workload::ALL {
            assert!(err.contains(workload.name()), "{err}");
        }
        assert!(run(&["--contenders", "3"]).is_err());
    }

    #[test]
    fn every_workload_is_picked_by_its_name() {
        for workload in Workload::ALL {
            let config = run(&["--only", workload.name()]).unwrap();
            assert_eq!(config.workloads, vec![workload]);
        }
    }

    #[test]
    fn the_server_is_redis_unless_valkey_is_asked_for() {
        assert!(!run(&[]).unwrap().valkey);
        assert!(run(&["--server", "valkey"]).unwrap().valkey);
        assert!(!run(&["--server", "redis"]).unwrap().valkey);
        let err = run(&["--server", "memcached"]).unwrap_err();
        assert!(
            err.contains("`--server`") && err.contains("`memcached`"),
            "{err}"
        );
    }

    #[test]
    fn placement_is_the_schedulers_unless_pinned() {
        assert_eq!(run(&[]).unwrap().pin, Pin::None);
        assert_eq!(run(&["--pin", "split"]).unwrap().pin, Pin::Split);
        assert_eq!(run(&["--pin", "shared"]).unwrap().pin, Pin::Shared);
        let err = run(&["--pin", "cpu1"]).unwrap_err();
        assert!(err.contains("`--pin`") && err.contains("`cpu1`"), "{err}");
    }

    #[test]
    fn worker_arguments_round_trip() {
        let worker = WorkerArgs {
            lib: LibId::Rslock,
            url: "redis://127.0.0.1:1".into(),
            key: "k".into(),
            tasks: 4,
            first_worker: 4,
            duration: Duration::from_millis(1500),
            critical_section: Duration::from_micros(10),
        };
        let Mode::Worker(parsed) = parse(worker.to_args().into_iter().map(OsString::from)).unwrap()
        else {
            panic!("not a worker");
        };
        assert_eq!(parsed.to_args(), worker.to_args());
    }
}
