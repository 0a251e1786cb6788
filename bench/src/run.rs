//! One benchmark run: start the server, learn each library's command origins, then for every
//! repetition measure the floor and every workload for every library, in the same order.

use crate::calibrate::{calibrate, Origins, Shape};
use crate::cli::{Config, Workload};
use crate::clients::{Client, LibId};
use crate::floor;
use crate::workloads::{
    attribute, contended, counts, etcd, held, mysql, open_loop, postgres, redlock, replicated,
    uncontended, zookeeper,
};
use distlock_test_support::{
    EtcdCluster, MariaDbServer, PgServer, RedisServer, ServerConfig, ZkEnsemble,
};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub(crate) use crate::workloads::Outcome;

/// Result sections, in report order.
pub(crate) const SECTIONS: [&str; 29] = [
    "sequential",
    "parallel",
    "contended",
    "contended_apart",
    "contended_processes",
    "contended_3_processes",
    "contended_6_processes",
    "held",
    "attribute",
    "redlock_sequential",
    "redlock_contended",
    "replicated",
    "etcd_sequential",
    "etcd_contended",
    "open_uniform_25",
    "open_uniform_50",
    "open_uniform_75",
    "open_uniform_90",
    "open_zipf_25",
    "open_zipf_50",
    "open_zipf_75",
    "open_zipf_90",
    "postgres_sequential",
    "postgres_contended",
    "mysql_sequential",
    "mysql_contended",
    "zookeeper_sequential",
    "zookeeper_contended",
    "counts",
];

/// The open-loop sections: key choice, offered rate in percent of rslock's closed-loop parallel
/// capacity, and the section's name.
pub(crate) const OPEN_LOOP: [(open_loop::Keys, u32, &str); 8] = [
    (open_loop::Keys::Uniform, 25, "open_uniform_25"),
    (open_loop::Keys::Uniform, 50, "open_uniform_50"),
    (open_loop::Keys::Uniform, 75, "open_uniform_75"),
    (open_loop::Keys::Uniform, 90, "open_uniform_90"),
    (open_loop::Keys::Zipf, 25, "open_zipf_25"),
    (open_loop::Keys::Zipf, 50, "open_zipf_50"),
    (open_loop::Keys::Zipf, 75, "open_zipf_75"),
    (open_loop::Keys::Zipf, 90, "open_zipf_90"),
];

/// The contended workload spread over more processes, 12 tasks in all each: section, processes,
/// tasks per process. Fixed sizes, not `--contenders`: the same 12 tasks cut two ways show what
/// the number of processes (connections, wake-ups across processes) costs a library, beside
/// `contended_processes` (2 processes × contenders/2 tasks).
pub(crate) const WIDER_CONTENDED: [(&str, usize, usize); 2] = [
    ("contended_3_processes", 3, 4),
    ("contended_6_processes", 6, 2),
];

/// Everything measured, before aggregation.
pub(crate) struct Measured {
    pub(crate) redis_version: String,
    /// The CPUs the client and the (first) server were allowed, read back after `--pin`.
    pub(crate) placement: Value,
    /// The full floor, once per run.
    pub(crate) floors: Vec<Map<String, Value>>,
    /// Per section, its samples: one per run, or one per slice of every run for the sliced
    /// workloads; each sample holds every library's outcome.
    pub(crate) samples: BTreeMap<&'static str, Vec<Vec<(LibId, Outcome)>>>,
    pub(crate) script_only: BTreeMap<LibId, Vec<String>>,
}

struct Subject {
    client: Arc<Client>,
    uncontended: Origins,
    contended: Origins,
}

/// The settings of every server the run starts: a redis-server, or a Valkey (`--server valkey`).
fn server_config(config: &Config) -> ServerConfig {
    match config.valkey {
        true => ServerConfig::new().valkey(),
        false => ServerConfig::new(),
    }
}

pub(crate) async fn run(config: &Config, progress: &dyn Fn(String)) -> Result<Measured, String> {
    let server = RedisServer::start_with(server_config(config));
    config.pin.server(server.pid())?;
    let redis_version = crate::server_stats::version(&server);
    let placement = serde_json::json!({
        "pin": config.pin.name(),
        "client_cpus": crate::pin::allowed_cpus(std::process::id()),
        "server_cpus": crate::pin::allowed_cpus(server.pid()),
    });
    progress(format!(
        "redis-server {redis_version} on {} (pid {}), placement: {}",
        server.addr(),
        server.pid(),
        config.pin.name()
    ));

    let mut subjects = Vec::new();
    let mut fifo_floor = None;
    let mut script_only = BTreeMap::new();
    for &lib in &config.libs {
        let client = Arc::new(Client::connect(lib, &server.url())?);
        client.warm_up("calibration").await?;
        let uncontended = calibrate(&server, &client, Shape::Uncontended).await?;
        let contended = calibrate(&server, &client, Shape::Contended).await?;
        script_only.insert(lib, uncontended.script_only());
        subjects.push(Subject {
            client,
            uncontended,
            contended,
        });
    }

    // The FIFO floor (not a library: `fifo_floor`), run beside the libraries in the contended
    // workloads only.
    if config.workloads.contains(&Workload::Contended) {
        let client = Arc::new(Client::connect(LibId::FifoFloor, &server.url())?);
        client.warm_up("calibration").await?;
        let contended = calibrate(&server, &client, Shape::Contended).await?;
        fifo_floor = Some(Subject {
            client,
            uncontended: Origins::default(),
            contended,
        });
    }

    // The Redlock workload's masters, started once (at its first repetition) for the whole run.
    let mut masters: Vec<RedisServer> = Vec::new();
    // The replicated workload's primary and replica, likewise.
    let mut replicated_pair: Vec<RedisServer> = Vec::new();
    // The etcd workload's cluster, likewise.
    let mut etcd_cluster: Option<EtcdCluster> = None;
    // The postgres workload's server, likewise.
    let mut pg_server: Option<PgServer> = None;
    // The mysql workload's server, likewise.
    let mut mariadb_server: Option<MariaDbServer> = None;
    // The zookeeper workload's ensemble, likewise.
    let mut zk_ensemble: Option<ZkEnsemble> = None;
    let mut measured = Measured {
        redis_version,
        placement,
        floors: Vec::new(),
        samples: BTreeMap::new(),
        script_only,
    };
    for rep in 0..config.runs {
        let label = |what: &str| format!("run {}/{}: {what}", rep + 1, config.runs);
        progress(label("floor"));
        let floor = floor::measure(
            &server,
            config.floor_requests,
            config.tasks,
            config.duration.min(Duration::from_secs(1)),
        )
        .await;
        for &workload in &config.workloads {
            progress(label(workload.name()));
            let samples = match workload {
                Workload::Sequential => {
                    uncontended_slices(config, &server, &subjects, &floor, 1, rep).await
                }
                Workload::Parallel => {
                    uncontended_slices(config, &server, &subjects, &floor, config.tasks, rep).await
                }
                Workload::Contended => {
                    let subjects: Vec<&Subject> = subjects.iter().chain(&fifo_floor).collect();
                    contended_slices(config, &server, &subjects, rep, &mut measured).await;
                    Vec::new()
                }
                Workload::Held => {
                    let periods = if config.smoke { 1 } else { 2 };
                    let mut rows = Vec::new();
                    for &lib in &config.libs {
                        let outcome = match lib {
                            LibId::Distlock => {
                                held::distlock(&server, config.leases, config.lease_ttl, periods)
                                    .await
                            }
                            // A fixed lease is never renewed: nothing to measure. The FIFO
                            // floor, etcd's lock service, distributed-lock-postgres,
                            // distributed-lock-mysql and zookeeper-client are never among
                            // `config.libs`.
                            LibId::DistlockFixed
                            | LibId::DistlockUnfenced
                            | LibId::FifoFloor
                            | LibId::EtcdLock
                            | LibId::DistributedLockPg
                            | LibId::DistributedLockMysql
                            | LibId::ZookeeperClient
                            | LibId::RedisRs => continue,
                            LibId::Rslock => {
                                held::rslock(&server, config.leases, config.lease_ttl, periods)
                                    .await
                            }
                            LibId::Redlock => Err(held::REDLOCK_NA.to_owned()),
                        };
                        rows.push((lib, outcome));
                    }
                    vec![("held", rows)]
                }
                Workload::Attribute => {
                    let (rounds, calls) = config.attribute_rounds;
                    let outcome = attribute::run(rounds, calls).await;
                    vec![("attribute", vec![(LibId::Distlock, outcome)])]
                }
                Workload::Redlock => {
                    if masters.is_empty() {
                        masters =
                            RedisServer::start_many_with(config.masters, &server_config(config));
                        for master in &masters {
                            config.pin.server(master.pid())?;
                        }
                    }
                    // Efficiency locks are for one server: Redlock refuses them.
                    let libs: Vec<LibId> = config
                        .libs
                        .iter()
                        .copied()
                        .filter(|lib| *lib != LibId::DistlockUnfenced)
                        .collect();
                    redlock::run(
                        &libs,
                        &masters,
                        config.duration,
                        config.contenders,
                        config.critical_section,
                        rep,
                    )
                    .await
                }
                Workload::OpenLoop => open_loop_sections(config, &server, &subjects, rep).await,
                Workload::Etcd => {
                    if etcd_cluster.is_none() {
                        let cluster = EtcdCluster::start(3);
                        for pid in cluster.pids() {
                            config.pin.server(pid)?;
                        }
                        etcd_cluster = Some(cluster);
                    }
                    let cluster = etcd_cluster.as_ref().expect("started above");
                    etcd::run(
                        cluster,
                        config.duration,
                        config.contenders,
                        config.critical_section,
                        rep,
                    )
                    .await
                }
                Workload::Postgres => {
                    if pg_server.is_none() {
                        pg_server = Some(postgres::start(config.pin)?);
                    }
                    let server = pg_server.as_ref().expect("started above");
                    postgres::run(
                        server,
                        config.duration,
                        config.contenders,
                        config.critical_section,
                        rep,
                    )
                    .await
                }
                Workload::Mysql => mysql_sections(config, &mut mariadb_server, rep).await?,
                Workload::Zookeeper => zookeeper_sections(config, &mut zk_ensemble, rep).await?,
                Workload::Counts => vec![("counts", counts::run(&server, config.smoke).await)],
                Workload::Replicated => {
                    if replicated_pair.is_empty() {
                        let primary = RedisServer::start_with(server_config(config));
                        let replica = RedisServer::start_with(
                            server_config(config).replica_of(primary.port()),
                        );
                        config.pin.server(primary.pid())?;
                        config.pin.server(replica.pid())?;
                        replica.wait_for_replica_sync();
                        primary.wait_for_replicas(1);
                        replicated_pair = vec![primary, replica];
                    }
                    replicated::run(
                        &config.libs,
                        &replicated_pair[0].url(),
                        config.duration,
                        rep,
                    )
                    .await
                }
            };
            for (section, rows) in samples {
                measured.push(section, rows);
            }
        }
        measured.floors.push(floor);
    }
    Ok(measured)
}

impl Measured {
    fn push(&mut self, section: &'static str, rows: Vec<(LibId, Outcome)>) {
        self.samples.entry(section).or_default().push(rows);
    }
}

/// The mysql workload's repetition `rep`, on the MariaDB server started (into `server`) at its
/// first repetition and kept for the whole run, as the postgres workload's.
async fn mysql_sections(
    config: &Config,
    server: &mut Option<MariaDbServer>,
    rep: usize,
) -> Result<Vec<(&'static str, Vec<(LibId, Outcome)>)>, String> {
    if server.is_none() {
        *server = Some(mysql::start(config.pin)?);
    }
    let server = server.as_ref().expect("started above");
    Ok(mysql::run(
        server,
        config.duration,
        config.contenders,
        config.critical_section,
        rep,
    )
    .await)
}

/// The zookeeper workload's repetition `rep`, on the ensemble started (into `ensemble`) at its
/// first repetition and kept for the whole run, as the mysql workload's server; a new ensemble
/// first runs one repetition whose numbers are dropped ([`zookeeper::warm`]).
async fn zookeeper_sections(
    config: &Config,
    ensemble: &mut Option<ZkEnsemble>,
    rep: usize,
) -> Result<Vec<(&'static str, Vec<(LibId, Outcome)>)>, String> {
    if ensemble.is_none() {
        let started = zookeeper::start(config.pin)?;
        zookeeper::warm(
            &started,
            config.duration,
            config.contenders,
            config.critical_section,
        )
        .await;
        *ensemble = Some(started);
    }
    let ensemble = ensemble.as_ref().expect("started above");
    Ok(zookeeper::run(
        ensemble,
        config.duration,
        config.contenders,
        config.critical_section,
        rep,
    )
    .await)
}

/// The open loop: rslock's closed-loop capacity with `config.tasks` tasks is measured first;
/// then every library serves the same Poisson schedules at 25, 50, 75 and 90 % of it, on
/// uniform and on Zipf keys.
async fn open_loop_sections(
    config: &Config,
    server: &RedisServer,
    subjects: &[Subject],
    rep: usize,
) -> Vec<(&'static str, Vec<(LibId, Outcome)>)> {
    // The data server each request reads one key from (the run's server, as the contended
    // workloads do).
    let data = match redis::Client::open(server.url()) {
        Ok(client) => client.get_multiplexed_async_connection().await.ok(),
        Err(_) => None,
    };
    let rslock = subjects.iter().find(|s| s.client.lib == LibId::Rslock);
    let capacity = match (rslock, &data) {
        (Some(subject), Some(data)) => {
            let tag = format!("{rep}");
            let length = config.duration.min(Duration::from_secs(1));
            open_loop::capacity(&subject.client, data, config.tasks, length, &tag)
                .await
                .ok()
        }
        _ => None,
    };
    let mut sections = Vec::new();
    for (keys, percent, section) in OPEN_LOOP {
        let mut rows = Vec::new();
        for subject in subjects {
            let lib = subject.client.lib;
            let outcome = match (capacity, &data) {
                (None, _) => Err("needs rslock's capacity, measured in the same run".to_owned()),
                (_, None) => Err("no connection to the data server".to_owned()),
                _ if subject.client.is_blocking() => {
                    Err("a blocking API: its calls would stall the open loop's runtime".to_owned())
                }
                (Some(capacity), Some(data)) => {
                    let rate = capacity * f64::from(percent) / 100.0;
                    let seed = (rep as u64) << 32 | u64::from(percent) << 8 | keys as u64;
                    let requests = open_loop::schedule(rate, config.duration, keys, seed);
                    let tag = format!("{section}:{rep}:{}", lib.name());
                    open_loop::run(&subject.client, data, &requests, &tag)
                        .await
                        .map(|mut result| {
                            result.insert("offered_per_s".into(), rate.into());
                            result
                        })
                }
            };
            rows.push((lib, outcome));
        }
        sections.push((section, rows));
    }
    sections
}

/// Workloads 1 and 2 in `config.slices` slices: the libraries take turns slice by slice, and
/// each slice's ratios are taken against the floor measured just before it and against rslock's
/// run in the same slice, so that the machine changing speed during a run (it does, on a shared
/// VM) moves every library and its floor alike.
async fn uncontended_slices(
    config: &Config,
    server: &RedisServer,
    subjects: &[Subject],
    floor: &Map<String, Value>,
    tasks: usize,
    rep: usize,
) -> Vec<(&'static str, Vec<(LibId, Outcome)>)> {
    let (section, floor_key, client_floor_key) = if tasks == 1 {
        ("sequential", "sequential_cycle_floor", "redis_rs_set_per_s")
    } else {
        (
            "parallel",
            "parallel_cycle_floor",
            "redis_rs_set_per_s_at_tasks",
        )
    };
    let slice_length = config.duration / config.slices as u32;
    let mut samples = Vec::new();
    for slice in 0..config.slices {
        let mut slice_floor = floor.clone();
        if config.slices > 1 {
            let requests = if tasks == 1 { 3_000 } else { 20_000 };
            if let Ok(rate) = floor::redis_benchmark_rate(server.port(), tasks, requests).await {
                slice_floor.insert(floor_key.into(), (rate / 2.0).into());
            }
        }
        let mut rows = Vec::new();
        for subject in subjects {
            let lib = subject.client.lib;
            let tag = format!("{section}:{rep}:{slice}:{}", lib.name());
            let outcome = uncontended::run(
                server,
                &subject.client,
                &subject.uncontended,
                tasks,
                slice_length,
                &tag,
            )
            .await;
            rows.push((lib, outcome));
        }
        add_ratio(&mut rows, "ratio_to_floor", &slice_floor, floor_key, 1.0);
        add_ratio(&mut rows, "ratio_to_redis_rs", floor, client_floor_key, 2.0);
        add_ratio_to_rslock(&mut rows, "cycles_per_s");
        samples.push((section, rows));
    }
    samples
}

/// Workload 3 in `config.contended_slices` slices, the libraries taking turns: one process,
/// then two processes, then the [`WIDER_CONTENDED`] spreads.
async fn contended_slices(
    config: &Config,
    server: &RedisServer,
    subjects: &[&Subject],
    rep: usize,
    measured: &mut Measured,
) {
    let slice_length = config.duration / config.contended_slices as u32;
    let spreads = [("contended_processes", 2, config.contenders / 2)];
    for slice in 0..config.contended_slices {
        let mut rows = Vec::new();
        for subject in subjects {
            let lib = subject.client.lib;
            let outcome = contended::in_process(
                server,
                &subject.client,
                &subject.contended,
                config.contenders,
                slice_length,
                config.critical_section,
                &format!("{rep}:{slice}:{}", lib.name()),
            )
            .await;
            rows.push((lib, outcome));
        }
        add_ratio_to_rslock(&mut rows, "cs_per_s");
        measured.push("contended", rows);
        let mut rows = Vec::new();
        for subject in subjects {
            let lib = subject.client.lib;
            let outcome = match subject.client.is_blocking() {
                true => Err("its clients block a thread each; not run".into()),
                false => {
                    contended::apart(
                        server,
                        lib,
                        &subject.contended,
                        config.contenders,
                        slice_length,
                        config.critical_section,
                        &format!("apart:{rep}:{slice}:{}", lib.name()),
                    )
                    .await
                }
            };
            rows.push((lib, outcome));
        }
        add_ratio_to_rslock(&mut rows, "cs_per_s");
        measured.push("contended_apart", rows);
        for (section, processes, per_process) in spreads.into_iter().chain(WIDER_CONTENDED) {
            let spread = (processes, per_process);
            let tag = format!("{rep}:{slice}");
            let rows = across_processes(config, server, subjects, spread, slice_length, &tag).await;
            measured.push(section, rows);
        }
    }
}

/// One slice of a multi-process section: every subject in turn, `processes` processes ×
/// `per_process` tasks on one key, with each row's ratio to rslock's in the same slice.
async fn across_processes(
    config: &Config,
    server: &RedisServer,
    subjects: &[&Subject],
    (processes, per_process): (usize, usize),
    slice_length: Duration,
    tag: &str,
) -> Vec<(LibId, Outcome)> {
    let mut rows = Vec::new();
    for subject in subjects {
        let lib = subject.client.lib;
        let outcome = contended::across_processes(
            server,
            &subject.client,
            &subject.contended,
            processes,
            per_process,
            slice_length,
            config.critical_section,
            &format!("procs{processes}x{per_process}:{tag}:{}", lib.name()),
        )
        .await;
        rows.push((lib, outcome));
    }
    add_ratio_to_rslock(&mut rows, "cs_per_s");
    rows
}

/// `name` = cycles/s ÷ (the floor's `floor_key` ÷ `per_cycle`), within this sample.
/// `sequential_cycle_floor` and `parallel_cycle_floor` are cycles/s already (`per_cycle` 1);
/// the redis-rs SET rates are commands/s, 2 per cycle.
fn add_ratio(
    rows: &mut [(LibId, Outcome)],
    name: &str,
    floor: &Map<String, Value>,
    floor_key: &str,
    per_cycle: f64,
) {
    let Some(reference) = floor.get(floor_key).and_then(Value::as_f64) else {
        return;
    };
    for (_, outcome) in rows.iter_mut() {
        if let Ok(result) = outcome {
            if let Some(value) = result.get("cycles_per_s").and_then(Value::as_f64) {
                result.insert(name.into(), (value / (reference / per_cycle)).into());
            }
        }
    }
}

/// `ratio_to_rslock` = `metric` / rslock's `metric`, within this sample.
fn add_ratio_to_rslock(rows: &mut [(LibId, Outcome)], metric: &str) {
    let reference = rows.iter().find_map(|(lib, outcome)| match (lib, outcome) {
        (LibId::Rslock, Ok(result)) => result.get(metric).and_then(Value::as_f64),
        _ => None,
    });
    let Some(reference) = reference.filter(|r| *r > 0.0) else {
        return;
    };
    for (_, outcome) in rows.iter_mut() {
        if let Ok(result) = outcome {
            if let Some(value) = result.get(metric).and_then(Value::as_f64) {
                result.insert("ratio_to_rslock".into(), (value / reference).into());
            }
        }
    }
}
