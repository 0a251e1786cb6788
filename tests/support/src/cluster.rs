//! A Redis Cluster on 127.0.0.1: masters and their replicas, all real
//! `redis-server` processes started by the harness (one [`RedisServer`] each,
//! so one free port and one temp dir each) and stopped by PID.
//!
//! The nodes are joined into a cluster by `redis-cli --cluster create` (from
//! `PATH`, or the binary named by [`REDIS_CLI_ENV`]), which also assigns the
//! slots and the replicas. Each node keeps its cluster state in `nodes.conf`
//! in its temp dir, so a node restarted with [`RedisServer::restart`] rejoins
//! with its identity (and, if it was failed over meanwhile, as a replica).
//!
//! What the harness waits for are the nodes' log lines: `Cluster state
//! changed: ok` once a node sees every slot served, `Cluster state changed:
//! fail` once it has flagged a master that serves slots as failed, `Failover
//! election won` on the replica that takes over, and the end of a replica's
//! sync; plus the exit of `redis-cli`. Nothing is polled.

use std::ffi::OsString;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::ports::free_cluster_port;
use crate::process::Child;
use crate::server::{tail, KILL_DEADLINE};
use crate::tls::TestPki;
use crate::{RedisServer, Reply, ServerConfig};

/// Environment variable naming the `redis-cli` binary to run; without it
/// `redis-cli` is looked up on `PATH`.
pub const REDIS_CLI_ENV: &str = "DISTLOCK_REDIS_CLI";

/// Hash slots in a Redis Cluster.
const SLOTS: u16 = 16384;
/// Each node's cluster config file. Relative, so Redis puts it in the node's
/// `dir`, the temp dir the harness gave it.
const NODES_FILE: &str = "nodes.conf";
/// Upper bound for `redis-cli --cluster create`, which sleeps in whole
/// seconds while the nodes meet (about 2 s for six nodes).
const CREATE_DEADLINE: Duration = Duration::from_secs(60);
/// Upper bound for `redis-cli --cluster check`.
const CHECK_DEADLINE: Duration = Duration::from_secs(20);
/// Upper bound, after the creation, for every node to report the cluster ok.
/// A master does so at the earliest 2 s after it started.
const SETTLE_DEADLINE: Duration = Duration::from_secs(20);
/// Upper bound for a failover, on top of ten node timeouts: the failure is
/// detected after one, the election starts 0.5–1 s (plus one second per
/// better-ranked replica) later, and a failed election is retried after
/// four (at least 4 s).
const FAILOVER_DEADLINE: Duration = Duration::from_secs(30);
/// Keys moved per `MIGRATE` by [`RedisCluster::migrate_slot`] (what
/// `redis-cli --cluster reshard` uses by default, `--cluster-pipeline 10`, is
/// smaller; a bigger batch only means fewer round trips here).
const MIGRATE_BATCH: usize = 100;
/// `MIGRATE`'s own timeout, below the harness's 10 s per command.
const MIGRATE_TIMEOUT: Duration = Duration::from_secs(5);

/// Logged by a node whenever its view of the cluster turns healthy, i.e. every
/// slot is served by a master it does not consider failed.
const STATE_OK_LINE: &str = "Cluster state changed: ok";
/// Logged by a node whenever its view of the cluster turns unhealthy, e.g.
/// once it flags a master that serves slots as failed.
const STATE_FAIL_LINE: &str = "Cluster state changed: fail";
/// Logged by the replica that takes over a failed master's slots.
const ELECTION_WON_LINE: &str = "Failover election won";

/// A Redis Cluster of `masters` masters with `replicas` replicas each, for
/// tests of cluster clients: redirections (`MOVED`, `ASK`), failovers and
/// slot migrations.
///
/// Every node runs with `cluster-enabled yes`, `cluster-config-file
/// nodes.conf` (in its temp dir) and the chosen `cluster-node-timeout`, plus
/// the [`RedisServer`] defaults (no persistence). `cluster-require-full-coverage`
/// keeps its default, `yes`: while a failed master's slots have no new owner,
/// every node answers `CLUSTERDOWN`, as in production.
///
/// The harness does not track roles: [`RedisCluster::masters`] and
/// [`RedisCluster::node_for_slot`] ask the running nodes each time.
///
/// Dropping the cluster SIGKILLs every node by PID and removes their temp
/// dirs.
#[derive(Debug)]
pub struct RedisCluster {
    /// In start order; killed nodes stay.
    nodes: Vec<RedisServer>,
    node_timeout: Duration,
    /// `cluster-require-full-coverage yes` (Redis's default): a failed master takes the whole
    /// cluster's state to `fail` until its replica is promoted.
    full_coverage: bool,
    /// A TLS cluster's certificates; declared last, so removed after every node is gone.
    pki: Option<TestPki>,
}

/// A node's replication role, from `ROLE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Master,
    /// A replica of the master on this port.
    Replica(u16),
}

/// One entry of `CLUSTER SLOTS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SlotRange {
    first: u16,
    last: u16,
    master: u16,
}

impl RedisCluster {
    /// Starts `masters × (1 + replicas)` nodes with `cluster-node-timeout` =
    /// `node_timeout`, joins them with `redis-cli --cluster create …
    /// --cluster-replicas <replicas> --cluster-yes`, and returns once
    ///
    /// * every node has logged that the cluster state is ok,
    /// * `redis-cli --cluster check` finds that all nodes agree on the slot
    ///   map and every slot is served, and
    /// * every replica has finished its initial sync and every master's
    ///   replicas acknowledge its writes (`WAIT`), so that a test's `WAIT`
    ///   does not have to wait for a replica's first acknowledgement.
    ///
    /// That takes about 2 s for 3 × 1 nodes (up to 5 s on a busy machine):
    /// `redis-cli` waits in whole seconds while the nodes meet, and a master
    /// does not report ok before 2 s after it started. `redis-cli` chooses which nodes become masters (with every
    /// node on one host, the first `masters` ones in start order) and gives
    /// them equal shares of the 16384 slots.
    ///
    /// A `node_timeout` of 1–2 s keeps failovers at a few seconds; much less
    /// than that risks failovers nobody asked for on a busy machine.
    ///
    /// # Panics
    ///
    /// If `masters < 3` (`redis-cli` refuses smaller clusters), if
    /// `node_timeout` is under 1 ms, if a node or `redis-cli` cannot be run,
    /// or if any of the above does not happen in time; the message quotes
    /// `redis-cli`'s output or the logs concerned.
    pub fn start(masters: usize, replicas: usize, node_timeout: Duration) -> RedisCluster {
        RedisCluster::start_with(masters, replicas, node_timeout, &[])
    }

    /// [`RedisCluster::start`], every node also given `args` (configuration
    /// directives and their values), e.g. `("cluster-require-full-coverage",
    /// "no")`.
    ///
    /// # Panics
    ///
    /// As [`RedisCluster::start`].
    pub fn start_with(
        masters: usize,
        replicas: usize,
        node_timeout: Duration,
        args: &[(&str, &str)],
    ) -> RedisCluster {
        RedisCluster::start_cluster(masters, replicas, node_timeout, args, None)
    }

    /// [`RedisCluster::start_with`], encrypted: every node takes clients on a TLS port (the
    /// certificate of [`RedisCluster::pki`]'s server), and the cluster bus and replication run
    /// over TLS (`tls-cluster`, `tls-replication`), so that the nodes name each other's TLS
    /// ports to TLS clients. Each node keeps a plain port on loopback for the harness's own
    /// commands (and `redis-cli`), to which the nodes name the plain ports.
    ///
    /// # Panics
    ///
    /// As [`RedisCluster::start`].
    pub fn start_tls(
        masters: usize,
        replicas: usize,
        node_timeout: Duration,
        args: &[(&str, &str)],
    ) -> RedisCluster {
        let pki = TestPki::generate();
        RedisCluster::start_cluster(masters, replicas, node_timeout, args, Some(pki))
    }

    fn start_cluster(
        masters: usize,
        replicas: usize,
        node_timeout: Duration,
        args: &[(&str, &str)],
        pki: Option<TestPki>,
    ) -> RedisCluster {
        assert!(
            masters >= 3,
            "RedisCluster::start: redis-cli --cluster create needs at least 3 masters, not {masters}"
        );
        let timeout_ms = node_timeout.as_millis();
        assert!(
            timeout_ms >= 1,
            "RedisCluster::start: node_timeout must be at least 1 ms, not {node_timeout:?}"
        );
        let config = args.iter().fold(
            ServerConfig::new()
                .arg("cluster-enabled", "yes")
                .arg("cluster-config-file", NODES_FILE)
                .arg("cluster-node-timeout", &timeout_ms.to_string()),
            |config, (name, value)| config.arg(name, value),
        );
        let configs = (0..masters * (1 + replicas)).map(|_| match &pki {
            // The bus listens on the TLS port plus 10000: both free.
            Some(pki) => pki
                .serve(config.clone(), free_cluster_port(), false)
                .arg("tls-cluster", "yes")
                .arg("tls-replication", "yes"),
            None => config.clone(),
        });
        let cluster = RedisCluster {
            nodes: RedisServer::start_each(configs.collect()),
            pki,
            node_timeout,
            full_coverage: !args.iter().any(|(name, value)| {
                name.eq_ignore_ascii_case("cluster-require-full-coverage")
                    && value.eq_ignore_ascii_case("no")
            }),
        };

        // Over TLS for a TLS cluster: the nodes meet on the bus of the port they are told of,
        // which with `tls-cluster` is the TLS port's.
        let mut args = match &cluster.pki {
            Some(pki) => vec![
                "--tls".to_owned(),
                "--cacert".to_owned(),
                pki.ca().to_string_lossy().into_owned(),
            ],
            None => Vec::new(),
        };
        args.extend(["--cluster".to_owned(), "create".to_owned()]);
        args.extend(
            cluster
                .nodes
                .iter()
                .map(|node| format!("127.0.0.1:{}", node.announced_port())),
        );
        args.extend([
            "--cluster-replicas".to_owned(),
            replicas.to_string(),
            "--cluster-yes".to_owned(),
        ]);
        if let Err(message) = run_redis_cli(&args, CREATE_DEADLINE) {
            panic!("{message}\n{}", cluster.node_tails(0..cluster.nodes.len()));
        }

        let deadline = Instant::now() + SETTLE_DEADLINE;
        for node in &cluster.nodes {
            if let Err(message) = node.await_log(STATE_OK_LINE, 0, deadline) {
                panic!("RedisCluster::start: {message}");
            }
        }
        cluster.check();
        cluster.wait_for_replicas();
        cluster
    }

    /// `redis://127.0.0.1:<port>` for every node, killed ones included, in
    /// start order.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// `redis-cluster://127.0.0.1:<p1>,127.0.0.1:<p2>,…`, listing every node
    /// (killed ones included) in start order; for a TLS cluster, `rediss-cluster://` and the
    /// nodes' TLS ports.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.announced_port()))
            .collect();
        let scheme = match self.pki {
            Some(_) => "rediss-cluster",
            None => "redis-cluster",
        };
        format!("{scheme}://{}", hosts.join(","))
    }

    /// A TLS cluster's certificates: its CA signed every node's.
    pub fn pki(&self) -> Option<&TestPki> {
        self.pki.as_ref()
    }

    /// Every node, killed ones included, in start order.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node on `port`.
    ///
    /// # Panics
    ///
    /// If no node of this cluster has that port.
    pub fn node(&self, port: u16) -> &RedisServer {
        &self.nodes[self.index_of(port)]
    }

    /// The running nodes that are masters now (`ROLE` on each), in start
    /// order.
    ///
    /// # Panics
    ///
    /// If a running node does not answer (a paused one, say) within 10 s.
    pub fn masters(&self) -> Vec<&RedisServer> {
        self.nodes
            .iter()
            .filter(|node| node.is_running() && role(node) == Role::Master)
            .collect()
    }

    /// The master serving `slot` now, according to `CLUSTER SLOTS` on the
    /// running masters (masters learn of failovers and migrations first;
    /// replicas may lag by some gossip): the first that names an owner. Right
    /// after a failover a master the news has not reached yet maps the slot
    /// to no one; the promoted master, which took it over, names itself.
    ///
    /// # Panics
    ///
    /// If `slot` is not below 16384, no master is running, or no running
    /// master says the slot is served by one of this cluster's nodes.
    pub fn node_for_slot(&self, slot: u16) -> &RedisServer {
        assert!(
            slot < SLOTS,
            "node_for_slot: slot {slot} is not below {SLOTS}"
        );
        let masters = self.masters();
        assert!(!masters.is_empty(), "no master of the cluster is running");
        let owner = masters.iter().find_map(|asked| {
            slot_map(asked)
                .into_iter()
                .find(|range| (range.first..=range.last).contains(&slot))
                .map(|range| range.master)
        });
        let owner = owner.unwrap_or_else(|| {
            let maps: Vec<String> = masters
                .iter()
                .map(|asked| {
                    format!(
                        "{}: {:?}",
                        asked.port(),
                        asked.command(&["CLUSTER", "SLOTS"])
                    )
                })
                .collect();
            panic!("node_for_slot: slot {slot} is served by no one: {maps:?}")
        });
        self.node(owner)
    }

    /// The hash slot of `key`: CRC16 (XMODEM) of its hash tag, the part
    /// between the first `{` and the next `}` if that is not empty, else of
    /// the whole key; modulo 16384. As `CLUSTER KEYSLOT` computes it.
    pub fn slot_of(key: impl AsRef<[u8]>) -> u16 {
        let key = key.as_ref();
        let hashed = key
            .iter()
            .position(|&b| b == b'{')
            .and_then(|open| {
                let rest = &key[open + 1..];
                let close = rest.iter().position(|&b| b == b'}')?;
                (close > 0).then(|| &rest[..close])
            })
            .unwrap_or(key);
        crc16_xmodem(hashed) % SLOTS
    }

    /// SIGKILLs the master serving `slot` and waits until one of its replicas
    /// has taken over: until every other running node has flagged the
    /// cluster failed (it saw the master fail) and then ok again (it saw the
    /// slots served by the promoted replica), and that replica has logged
    /// winning the election. With `cluster-require-full-coverage no` no
    /// node's state changes: it waits for the master's one replica to win
    /// its election and serve the slot.
    ///
    /// Returns the killed node's port, the promoted node's port, and the time
    /// from the kill until the last node reported the cluster ok: about one
    /// node timeout to detect the failure, plus 0.5–1 s before the replica
    /// asks for votes, plus up to a second per replica of the same master
    /// ranked above it.
    ///
    /// The killed node stays in [`RedisCluster::nodes`], not running. Other
    /// replicas of the killed master (with `replicas` ≥ 2) follow the
    /// promoted one, but their resync is not waited for.
    ///
    /// # Panics
    ///
    /// If the master has no running replica, or the failover does not
    /// complete within 30 s plus ten node timeouts; the message quotes the
    /// logs of the node waited on and of the replicas.
    pub fn kill_master_and_wait_failover(&mut self, slot: u16) -> (u16, u16, Duration) {
        let old = self.index_of(self.node_for_slot(slot).port());
        let old_port = self.nodes[old].port();
        let candidates: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| {
                // A replica names its master by the port it replicates from: the TLS one in
                // a TLS cluster.
                self.nodes[i].is_running()
                    && role(&self.nodes[i]) == Role::Replica(self.nodes[old].announced_port())
            })
            .collect();
        assert!(
            !candidates.is_empty(),
            "kill_master_and_wait_failover: the master on port {old_port} (slot {slot}) has no \
             running replica to promote"
        );
        let survivors: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| i != old && self.nodes[i].is_running())
            .collect();
        // Each node logs both state lines once per failover: only lines
        // after these marks count.
        let marks: Vec<usize> = survivors
            .iter()
            .map(|&i| self.nodes[i].log_mark())
            .collect();

        let killed_at = Instant::now();
        self.nodes[old].kill();
        let fail_over_panic = |message: String| -> ! {
            panic!(
                "kill_master_and_wait_failover: slot {slot}, master on port {old_port} killed: \
                 {message}\nthe replicas:\n{}",
                self.node_tails(candidates.iter().copied())
            )
        };
        let deadline = killed_at + FAILOVER_DEADLINE + self.node_timeout * 10;
        let new_port = if self.full_coverage {
            for (&i, &mark) in survivors.iter().zip(&marks) {
                let node = &self.nodes[i];
                let failed = node
                    .await_log(STATE_FAIL_LINE, mark, deadline)
                    .unwrap_or_else(|m| fail_over_panic(m));
                node.await_log(STATE_OK_LINE, failed, deadline)
                    .unwrap_or_else(|m| fail_over_panic(m));
            }
            self.node_for_slot(slot).port()
        } else {
            // No node's state changes: the failover is done when the replica won its
            // election, and the winner is the one that knows it first.
            let [only] = candidates[..] else {
                fail_over_panic(format!(
                    "with cluster-require-full-coverage no, the harness waits for the election \
                     of the one replica; the master has {}",
                    candidates.len()
                ))
            };
            let position = survivors
                .iter()
                .position(|&i| i == only)
                .expect("a running replica survives");
            self.nodes[only]
                .await_log(ELECTION_WON_LINE, marks[position], deadline)
                .unwrap_or_else(|m| fail_over_panic(m));
            let port = self.nodes[only].port();
            let serves = slot_map(&self.nodes[only])
                .into_iter()
                .any(|range| (range.first..=range.last).contains(&slot) && range.master == port);
            if !serves {
                fail_over_panic(format!(
                    "port {port} won its election but does not serve the slot"
                ));
            }
            port
        };
        let took = killed_at.elapsed();

        let new = self.index_of(new_port);
        let Some(position) = survivors.iter().position(|&i| i == new) else {
            fail_over_panic(format!("slot {slot} is now served by port {new_port}?"))
        };
        if !candidates.contains(&new) {
            fail_over_panic(format!(
                "slot {slot} is now served by port {new_port}, not one of the replicas"
            ));
        }
        if let Err(m) = self.nodes[new].await_log(ELECTION_WON_LINE, marks[position], deadline) {
            fail_over_panic(m);
        }
        (old_port, new_port, took)
    }

    /// Moves `slot` from the master serving it to the master on `to_port`
    /// with the live migration protocol, as `redis-cli --cluster reshard`
    /// does:
    ///
    /// 1. `CLUSTER SETSLOT <slot> IMPORTING <source id>` on the target, then
    ///    `… MIGRATING <target id>` on the source; from here on the source
    ///    answers `ASK` for keys of the slot it no longer has;
    /// 2. `CLUSTER GETKEYSINSLOT <slot> 100` and `MIGRATE 127.0.0.1 <to_port>
    ///    "" 0 5000 KEYS …` on the source, until the slot is empty there;
    /// 3. `CLUSTER SETSLOT <slot> NODE <target id>` on the target, the source
    ///    and every other running master, in that order.
    ///
    /// Returns `to_port` once all of that is done (at once if the target
    /// already serves the slot). From then on every master answers `MOVED`
    /// to the target for the slot; replicas learn of the move by gossip,
    /// within about half a node timeout.
    ///
    /// Keys must be UTF-8, since the harness's client sends `&str` arguments.
    ///
    /// # Panics
    ///
    /// If `to_port` is not a running master of this cluster, or any of the
    /// commands fails (e.g. `MIGRATE` finding the key at the target already:
    /// `BUSYKEY`); the message quotes the node's log.
    pub fn migrate_slot(&self, slot: u16, to_port: u16) -> u16 {
        let source = self.node_for_slot(slot);
        let target = self.node(to_port);
        assert!(
            target.is_running() && role(target) == Role::Master,
            "migrate_slot: the node on port {to_port} is not a running master"
        );
        if source.port() == to_port {
            return to_port;
        }
        let (slot_arg, source_id, target_id) = (slot.to_string(), node_id(source), node_id(target));
        expect_ok(
            target,
            &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &source_id],
        );
        expect_ok(
            source,
            &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &target_id],
        );

        let (batch, port, timeout_ms) = (
            MIGRATE_BATCH.to_string(),
            to_port.to_string(),
            MIGRATE_TIMEOUT.as_millis().to_string(),
        );
        loop {
            let reply = source.command(&["CLUSTER", "GETKEYSINSLOT", &slot_arg, &batch]);
            let keys: Vec<String> = reply
                .as_array()
                .unwrap_or_else(|| {
                    panic!(
                        "migrate_slot: GETKEYSINSLOT on port {} answered {reply:?}",
                        source.port()
                    )
                })
                .iter()
                .map(|key| {
                    key.as_str().unwrap_or_else(|| {
                        panic!("migrate_slot: key {key:?} of slot {slot} is not UTF-8")
                    })
                })
                .collect();
            if keys.is_empty() {
                break;
            }
            let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", &timeout_ms, "KEYS"];
            migrate.extend(keys.iter().map(String::as_str));
            // NOKEY: every key of the batch expired in the meantime.
            match source.command(&migrate) {
                Reply::Simple(ok) if ok == "OK" || ok == "NOKEY" => {}
                other => panic!(
                    "migrate_slot: MIGRATE of slot {slot} from port {} to {to_port} answered \
                     {other:?}; source log:\n{}\ntarget log:\n{}",
                    source.port(),
                    tail(&source.log()),
                    tail(&target.log())
                ),
            }
        }

        // The target first: it bumps its config epoch, so that its claim
        // wins wherever gossip meets an older one.
        let assign = ["CLUSTER", "SETSLOT", &slot_arg, "NODE", &target_id];
        expect_ok(target, &assign);
        expect_ok(source, &assign);
        for master in self.masters() {
            if master.port() != source.port() && master.port() != to_port {
                expect_ok(master, &assign);
            }
        }
        to_port
    }

    /// Runs `args` on every master ([`RedisCluster::masters`]) and returns
    /// the replies in the same order, e.g. to sum `INFO commandstats` over
    /// the cluster.
    pub fn command_on_all_masters(&self, args: &[&str]) -> Vec<Reply> {
        self.masters()
            .into_iter()
            .map(|master| master.command(args))
            .collect()
    }

    /// Runs `redis-cli --cluster check` against a running master: all
    /// reachable nodes agree on the slot map, every slot is served, and none
    /// is being migrated. Nodes the cluster considers failed are left out.
    ///
    /// Right after a [`RedisCluster::migrate_slot`] replicas may not have
    /// heard of the move yet, and then this fails.
    ///
    /// # Panics
    ///
    /// If the check fails; the message quotes `redis-cli`'s output.
    pub fn check(&self) {
        let args = [
            "--cluster".to_owned(),
            "check".to_owned(),
            self.any_master().addr().to_string(),
        ];
        if let Err(message) = run_redis_cli(&args, CHECK_DEADLINE) {
            panic!("{message}");
        }
    }

    /// Every running master waits for its replicas' acknowledgements; see
    /// [`RedisServer::wait_for_replicas`].
    fn wait_for_replicas(&self) {
        let roles: Vec<(&RedisServer, Role)> = self
            .nodes
            .iter()
            .filter(|node| node.is_running())
            .map(|node| (node, role(node)))
            .collect();
        for (node, role) in &roles {
            if let Role::Replica(_) = role {
                node.wait_for_replica_sync();
            }
        }
        let map = slot_map(self.any_master());
        for (master, _) in roles.iter().filter(|(_, role)| *role == Role::Master) {
            let replicas = roles
                .iter()
                .filter(|(_, role)| *role == Role::Replica(master.announced_port()))
                .count();
            if replicas > 0 {
                master.wait_for_replicas_using(&key_served_by(&map, master.port()), replicas);
            }
        }
    }

    fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|node| node.port() == port)
            .unwrap_or_else(|| panic!("port {port} is not a node of this cluster"))
    }

    /// The first running master, in start order.
    fn any_master(&self) -> &RedisServer {
        self.nodes
            .iter()
            .find(|node| node.is_running() && role(node) == Role::Master)
            .unwrap_or_else(|| panic!("no master of the cluster is running"))
    }

    /// The logs' tails of the nodes at `indices`, each under a header line.
    fn node_tails(&self, indices: impl IntoIterator<Item = usize>) -> String {
        indices
            .into_iter()
            .map(|i| {
                let node = &self.nodes[i];
                format!(
                    "--- node 127.0.0.1:{} (PID {}) ---\n{}",
                    node.port(),
                    node.pid(),
                    tail(&node.log())
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// CRC16 with polynomial 0x1021, initial value 0 and no reflection (XMODEM),
/// as in Redis's `crc16.c`.
fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// A key whose slot `master` serves according to `map`.
fn key_served_by(map: &[SlotRange], master: u16) -> String {
    (0u32..)
        .map(|n| format!("distlock-harness:replicas:{n}"))
        .find(|key| {
            let slot = RedisCluster::slot_of(key);
            map.iter()
                .any(|r| r.master == master && (r.first..=r.last).contains(&slot))
        })
        .expect("some key hashes into any non-empty slot range")
}

/// The `redis-cli` binary: [`REDIS_CLI_ENV`] if set, else from `PATH`.
fn redis_cli_binary() -> OsString {
    std::env::var_os(REDIS_CLI_ENV).unwrap_or_else(|| OsString::from("redis-cli"))
}

/// Runs `redis-cli <args>` to its exit; `Ok` with its output if it exits 0,
/// else `Err` with a panic message quoting the output.
fn run_redis_cli(args: &[String], deadline: Duration) -> Result<String, String> {
    let shown = format!("redis-cli {}", args.join(" "));
    let mut command = Command::new(redis_cli_binary());
    command.args(args);
    let child = Child::spawn(command).map_err(|e| {
        format!(
            "cannot run redis-cli ({e}); install it (it comes with redis-server, e.g. \
             `apt-get install redis-tools`) or point {REDIS_CLI_ENV} at the binary"
        )
    })?;
    match child.wait_exit(deadline) {
        Some(status) if status.success() => Ok(child.output()),
        Some(status) => Err(format!(
            "`{shown}` exited ({status}); output:\n{}",
            child.output()
        )),
        None => {
            child.signal(libc::SIGKILL);
            child.wait_exit(KILL_DEADLINE);
            Err(format!(
                "`{shown}` did not finish within {deadline:?}; output:\n{}",
                child.output()
            ))
        }
    }
}

/// The node's role according to `ROLE`.
fn role(node: &RedisServer) -> Role {
    let reply = node.command(&["ROLE"]);
    let parsed = reply.as_array().and_then(|fields| {
        match fields.first()?.as_str()?.as_str() {
            "master" => Some(Role::Master),
            // ["slave", master ip, master port, state, offset]
            "slave" => Some(Role::Replica(u16::try_from(fields.get(2)?.as_int()?).ok()?)),
            _ => None,
        }
    });
    parsed.unwrap_or_else(|| {
        panic!(
            "redis-server on port {}: ROLE answered {reply:?}",
            node.port()
        )
    })
}

/// The node's cluster node ID (`CLUSTER MYID`).
fn node_id(node: &RedisServer) -> String {
    let reply = node.command(&["CLUSTER", "MYID"]);
    reply.as_str().unwrap_or_else(|| {
        panic!(
            "redis-server on port {}: CLUSTER MYID answered {reply:?}",
            node.port()
        )
    })
}

/// The slot map according to `node` (`CLUSTER SLOTS`).
fn slot_map(node: &RedisServer) -> Vec<SlotRange> {
    let reply = node.command(&["CLUSTER", "SLOTS"]);
    parse_slot_map(&reply).unwrap_or_else(|| {
        panic!(
            "redis-server on port {}: CLUSTER SLOTS answered {reply:?}",
            node.port()
        )
    })
}

/// A `CLUSTER SLOTS` reply as ranges and their masters' ports.
fn parse_slot_map(reply: &Reply) -> Option<Vec<SlotRange>> {
    let parse = |entry: &Reply| -> Option<SlotRange> {
        // [first, last, [master ip, master port, id, …], replicas…]
        let fields = entry.as_array()?;
        let slot = |i: usize| u16::try_from(fields.get(i)?.as_int()?).ok();
        let master = fields.get(2)?.as_array()?.get(1)?.as_int()?;
        Some(SlotRange {
            first: slot(0)?,
            last: slot(1)?,
            master: u16::try_from(master).ok()?,
        })
    };
    reply.as_array()?.iter().map(parse).collect()
}

/// Runs `args` on `node` and panics unless it answers `OK`.
fn expect_ok(node: &RedisServer, args: &[&str]) {
    let reply = node.command(args);
    assert_eq!(
        reply,
        Reply::Simple("OK".into()),
        "redis-server on port {}: {args:?}; log:\n{}",
        node.port(),
        tail(&node.log())
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_is_the_xmodem_variant() {
        // The check value of CRC-16/XMODEM, also Redis's own crc16 test.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
        assert_eq!(crc16_xmodem(b""), 0);
    }

    #[test]
    fn slots_follow_the_hash_tag_rules() {
        // Values from CLUSTER KEYSLOT.
        assert_eq!(RedisCluster::slot_of("foo"), 12182);
        assert_eq!(RedisCluster::slot_of("bar"), 5061);
        assert_eq!(RedisCluster::slot_of(""), 0);
        let user = RedisCluster::slot_of("user1000");
        assert_eq!(RedisCluster::slot_of("{user1000}.following"), user);
        assert_eq!(RedisCluster::slot_of("a{user1000}b{x}"), user);
        // Only the first `{` opens a tag, and the first `}` after it closes it.
        assert_eq!(
            RedisCluster::slot_of("foo{{bar}}zap"),
            RedisCluster::slot_of("{bar")
        );
        // An empty or unclosed tag means the whole key is hashed.
        assert_eq!(
            RedisCluster::slot_of("{}user1000"),
            crc16_xmodem(b"{}user1000") % SLOTS
        );
        assert_eq!(
            RedisCluster::slot_of("{user1000"),
            crc16_xmodem(b"{user1000") % SLOTS
        );
        assert_eq!(RedisCluster::slot_of(b"foo".as_slice()), 12182);
    }

    #[test]
    fn a_failing_redis_cli_is_reported_with_its_output() {
        let nobody = crate::free_port().to_string();
        let args = ["--cluster", "check", &format!("127.0.0.1:{nobody}")].map(String::from);
        let message = run_redis_cli(&args, CHECK_DEADLINE).unwrap_err();
        assert!(message.contains("exited"), "{message}");
        assert!(message.contains(&nobody), "{message}");
    }

    #[test]
    fn slot_maps_are_parsed_from_cluster_slots_replies() {
        let (int, bulk) = (Reply::Int, |s: &str| {
            Reply::Bulk(Some(s.as_bytes().to_vec()))
        });
        let node = |port| Reply::Array(Some(vec![bulk("127.0.0.1"), int(port), bulk("id")]));
        let entry = |first, last, master| {
            Reply::Array(Some(vec![int(first), int(last), node(master), node(7003)]))
        };
        let reply = Reply::Array(Some(vec![entry(0, 5460, 7000), entry(5461, 16383, 7001)]));
        let map = parse_slot_map(&reply).unwrap();
        let ranges: Vec<_> = map.iter().map(|r| (r.first, r.last, r.master)).collect();
        assert_eq!(ranges, [(0, 5460, 7000), (5461, 16383, 7001)]);
        let key = key_served_by(&map, 7001);
        assert!(RedisCluster::slot_of(&key) >= 5461, "{key}");
        assert_eq!(parse_slot_map(&Reply::Array(Some(vec![int(0)]))), None);
    }
}
