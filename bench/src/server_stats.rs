//! What the server did during a measured window: `INFO commandstats` (reset with
//! `CONFIG RESETSTAT` before, read after) and `INFO cpu` (read before and after).
//!
//! `commandstats` counts every command the server executed, including those a Lua script ran
//! with `redis.call`. Which of them a client sent is learnt once per library and workload shape
//! by [`calibrate`](crate::calibrate); [`Delta::client_commands`] applies it.

use crate::calibrate::Origins;
use distlock_test_support::RedisServer;
use std::collections::BTreeMap;
use std::time::Duration;

/// Commands the benchmark itself sends in a window; they are nobody's cost.
fn is_harness(command: &str) -> bool {
    command == "info" || command == "flushall" || command.starts_with("config|")
}

/// Script invocations: always sent by a client (a script cannot call another).
pub(crate) fn is_script_call(command: &str) -> bool {
    matches!(
        command,
        "eval" | "evalsha" | "eval_ro" | "evalsha_ro" | "fcall" | "fcall_ro"
    )
}

/// An open measurement window.
pub(crate) struct Window {
    cpu_before: Duration,
}

/// What the server did in a window.
#[derive(Debug, Clone, Default)]
pub(crate) struct Delta {
    /// Calls per command (`commandstats` names, `client|setinfo` style for subcommands).
    pub(crate) calls: BTreeMap<String, u64>,
    /// Execution time per command in µs, as `commandstats` reports it: a script's time includes
    /// the commands it ran, and none of it is network I/O.
    pub(crate) usec: BTreeMap<String, u64>,
    /// Server CPU time, user + system, all threads.
    pub(crate) cpu: Duration,
}

impl Window {
    pub(crate) fn open(server: &RedisServer) -> Window {
        let cpu_before = cpu(server);
        ok(server, &["CONFIG", "RESETSTAT"]);
        Window { cpu_before }
    }

    pub(crate) fn close(self, server: &RedisServer) -> Delta {
        let (calls, usec) = commandstats(server)
            .into_iter()
            .map(|(name, calls, usec)| ((name.clone(), calls), (name, usec)))
            .unzip();
        let cpu = cpu(server).saturating_sub(self.cpu_before);
        Delta { calls, usec, cpu }
    }
}

impl Delta {
    /// Every command executed, script-internal ones included.
    pub(crate) fn total(&self) -> u64 {
        self.calls.values().sum()
    }

    /// Script invocations (EVAL, EVALSHA, FCALL and their read-only forms).
    pub(crate) fn script_calls(&self) -> u64 {
        self.calls
            .iter()
            .filter(|(name, _)| is_script_call(name))
            .map(|(_, n)| n)
            .sum()
    }

    /// Commands clients sent (round trips' worth of work), using the origins measured for this
    /// library and workload shape. A command calibration never saw counts as a client's.
    pub(crate) fn client_commands(&self, origins: &Origins) -> f64 {
        self.calls
            .iter()
            .map(|(name, &n)| n as f64 * origins.client_share(name))
            .sum()
    }

    /// Server execution time of the commands clients sent, in µs (script time includes the
    /// commands the script ran, so nothing is counted twice).
    pub(crate) fn client_exec_us(&self, origins: &Origins) -> f64 {
        self.usec
            .iter()
            .map(|(name, &us)| us as f64 * origins.client_share(name))
            .sum()
    }

    /// Commands of this window the calibration never saw, counted as clients' by default: a
    /// non-empty list means the client/script split may be off.
    pub(crate) fn unclassified(&self, origins: &Origins) -> Vec<String> {
        self.calls
            .keys()
            .filter(|name| !is_script_call(name) && !origins.knows(name))
            .cloned()
            .collect()
    }

    /// Records what the server did per `units` (cycles, locks) in `result`, as
    /// `<metric>_per_<unit>`: client and server commands, Redis execution and CPU time, the
    /// client's CPU when known, every command's count, and the commands no miniature classified.
    pub(crate) fn record_costs(
        &self,
        result: &mut serde_json::Map<String, serde_json::Value>,
        origins: &Origins,
        units: u64,
        unit: &str,
        client_cpu: Option<Duration>,
    ) {
        let per_unit = |total: f64| total / units.max(1) as f64;
        let mut put = |metric: &str, value: f64| {
            result.insert(format!("{metric}_per_{unit}"), value.into());
        };
        put("client_cmds", per_unit(self.client_commands(origins)));
        put("server_cmds", per_unit(self.total() as f64));
        put("redis_exec_us", per_unit(self.client_exec_us(origins)));
        put("redis_cpu_us", per_unit(self.cpu.as_secs_f64() * 1e6));
        if let Some(cpu) = client_cpu {
            put("client_cpu_us", per_unit(cpu.as_secs_f64() * 1e6));
        }
        result.insert(format!("commands_per_{unit}"), self.per_unit(units).into());
        result.insert(
            "unclassified_commands".into(),
            self.unclassified(origins).into(),
        );
    }

    /// `name=calls/unit` for every command, for the JSON line.
    pub(crate) fn per_unit(&self, units: u64) -> serde_json::Map<String, serde_json::Value> {
        self.calls
            .iter()
            .map(|(name, &n)| (name.clone(), round3(n as f64 / units.max(1) as f64).into()))
            .collect()
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn ok(server: &RedisServer, args: &[&str]) {
    let reply = server.command(args);
    assert!(
        reply.as_error().is_none(),
        "redis-server: {args:?} failed: {reply:?}"
    );
}

pub(crate) fn flush(server: &RedisServer) {
    ok(server, &["FLUSHALL"]);
}

fn info(server: &RedisServer, section: &str) -> String {
    server
        .command(&["INFO", section])
        .as_str()
        .unwrap_or_else(|| panic!("INFO {section} answered no text"))
}

fn commandstats(server: &RedisServer) -> Vec<(String, u64, u64)> {
    parse_commandstats(&info(server, "commandstats"))
        .filter(|(name, _, _)| !is_harness(name))
        .collect()
}

/// `cmdstat_evalsha:calls=12,usec=40,…` → `("evalsha", 12, 40)`.
fn parse_commandstats(text: &str) -> impl Iterator<Item = (String, u64, u64)> + '_ {
    text.lines().filter_map(|line| {
        let (name, fields) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
        let field = |prefix: &str| -> Option<u64> {
            fields
                .split(',')
                .find_map(|field| field.strip_prefix(prefix))?
                .parse()
                .ok()
        };
        Some((name.to_owned(), field("calls=")?, field("usec=")?))
    })
}

fn cpu(server: &RedisServer) -> Duration {
    parse_cpu(&info(server, "cpu"))
}

/// `used_cpu_sys` + `used_cpu_user`, seconds with µs precision.
fn parse_cpu(text: &str) -> Duration {
    let seconds: f64 = text
        .lines()
        .filter_map(|line| {
            let (name, value) = line.trim().split_once(':')?;
            matches!(name, "used_cpu_sys" | "used_cpu_user").then(|| value.parse::<f64>().ok())?
        })
        .sum();
    Duration::from_secs_f64(seconds)
}

/// The server's version, for the report.
pub(crate) fn version(server: &RedisServer) -> String {
    let info = info(server, "server");
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.trim().strip_prefix(name).map(str::to_owned))
    };
    // A Valkey also reports the Redis version it is compatible with: its own is the one to show.
    match field("valkey_version:") {
        Some(valkey) => format!("valkey {valkey}"),
        None => field("redis_version:").unwrap_or_else(|| "unknown".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_lines_parse_with_subcommands() {
        let text = "# Commandstats\r\ncmdstat_evalsha:calls=20,usec=90,usec_per_call=4.50,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_client|setinfo:calls=2,usec=1,usec_per_call=0.50,rejected_calls=0,failed_calls=0\r\n";
        let parsed: Vec<_> = parse_commandstats(text).collect();
        assert_eq!(
            parsed,
            vec![("evalsha".into(), 20, 90), ("client|setinfo".into(), 2, 1)]
        );
    }

    #[test]
    fn cpu_adds_user_and_system_time() {
        let text = "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:0.250000\r\nused_cpu_sys_children:9.000000\r\n";
        assert_eq!(parse_cpu(text), Duration::from_millis(1750));
    }
}
