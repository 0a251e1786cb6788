//! Which commands a library's clients send, and which its Lua scripts run.
//!
//! `INFO commandstats` counts both kinds alike (an EVALSHA whose script runs HGET and PEXPIRE
//! shows as three calls). `MONITOR` tells them apart (`[0 lua]` against `[0 127.0.0.1:port]`),
//! but doubles the server's work, so it never runs during a measurement: each library runs a
//! miniature of the workload shape under MONITOR once, before the timed runs, and the origins
//! seen there split the timed runs' `commandstats`.

use crate::clients::{run_workers, Client};
use distlock_test_support::RedisServer;
use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Sent through a separate connection after the miniature; when MONITOR shows it, every earlier
/// command has been seen.
const SENTINEL: &str = "distlock-bench-calibration-end";
const MONITOR_TIMEOUT: Duration = Duration::from_secs(20);

/// Per command name: calls seen from clients, calls seen from scripts.
#[derive(Debug, Clone, Default)]
pub(crate) struct Origins {
    seen: BTreeMap<String, (u64, u64)>,
}

impl Origins {
    /// The share of `command`'s calls (a `commandstats` name, e.g. `client|setinfo`) that
    /// clients sent. A command the miniature never ran is taken as a client's.
    pub(crate) fn client_share(&self, command: &str) -> f64 {
        let top = command.split('|').next().unwrap_or(command);
        match self.seen.get(top) {
            Some(&(client, script)) if client + script > 0 => {
                client as f64 / (client + script) as f64
            }
            _ => 1.0,
        }
    }

    /// Whether the miniature ran `command` at all.
    pub(crate) fn knows(&self, command: &str) -> bool {
        self.seen
            .contains_key(command.split('|').next().unwrap_or(command))
    }

    /// Commands seen only inside scripts, for the report.
    pub(crate) fn script_only(&self) -> Vec<String> {
        self.seen
            .iter()
            .filter(|(_, &(client, script))| client == 0 && script > 0)
            .map(|(name, _)| name.clone())
            .collect()
    }
}

/// The workload shapes whose command mix differs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Shape {
    /// Acquire + release of free keys.
    Uncontended,
    /// A busy key: failed attempts, waiting, a handoff.
    Contended,
}

/// Runs the miniature of `shape` for `client` under MONITOR.
pub(crate) async fn calibrate(
    server: &RedisServer,
    client: &Arc<Client>,
    shape: Shape,
) -> Result<Origins, String> {
    let monitor = Monitor::start(server).map_err(|e| format!("MONITOR: {e}"))?;
    let outcome = match shape {
        Shape::Uncontended => cycles(client).await,
        Shape::Contended => contended(client, server).await,
    };
    server.command(&["ECHO", SENTINEL]);
    let origins = monitor.finish().map_err(|e| format!("MONITOR: {e}"))?;
    outcome.map(|()| origins)
}

async fn cycles(client: &Arc<Client>) -> Result<(), String> {
    run_workers(client, 1, |_, client| async move {
        for i in 0..20 {
            let held = client.acquire(&format!("calibrate:free:{i}")).await?;
            client.release(held).await?;
        }
        Ok(())
    })
    .await
    .remove(0)
}

/// Handoffs within the client (its tasks may queue locally) and between it and a second client
/// of the same library (a busy key on the server, as between processes), both ways.
async fn contended(client: &Arc<Client>, server: &RedisServer) -> Result<(), String> {
    let other = Arc::new(Client::connect(client.lib, &server.url())?);
    other.warm_up("calibration-other").await?;
    handoff(client, client).await?;
    handoff(&other, client).await?;
    handoff(client, &other).await
}

/// `holder` takes the key, `waiter` asks for it while it is held, then gets it.
async fn handoff(holder: &Arc<Client>, waiter: &Arc<Client>) -> Result<(), String> {
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let (holder, waiter) = (holder.clone(), waiter.clone());
    let results = run_workers(&holder.clone(), 2, move |worker, _| {
        let barrier = barrier.clone();
        let (holder, waiter) = (holder.clone(), waiter.clone());
        async move {
            let key = "calibrate:busy";
            if worker == 0 {
                let held = holder.acquire(key).await?;
                barrier.wait().await;
                tokio::time::sleep(Duration::from_millis(30)).await;
                holder.release(held).await
            } else {
                barrier.wait().await;
                let held = waiter.acquire(key).await?;
                waiter.release(held).await
            }
        }
    })
    .await;
    results.into_iter().collect()
}

/// A MONITOR connection read on a thread of its own.
struct Monitor {
    reader: JoinHandle<io::Result<Origins>>,
}

impl Monitor {
    fn start(server: &RedisServer) -> io::Result<Monitor> {
        let mut stream = TcpStream::connect(server.addr())?;
        stream.set_read_timeout(Some(MONITOR_TIMEOUT))?;
        stream.write_all(b"*1\r\n$7\r\nMONITOR\r\n")?;
        let mut lines = BufReader::new(stream);
        let mut ok = String::new();
        lines.read_line(&mut ok)?;
        if ok.trim_end() != "+OK" {
            return Err(io::Error::other(format!("MONITOR answered {ok:?}")));
        }
        // MONITOR is in effect once +OK is back: nothing sent from now on is missed.
        let reader = std::thread::spawn(move || read_until_sentinel(lines));
        Ok(Monitor { reader })
    }

    fn finish(self) -> io::Result<Origins> {
        self.reader
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }
}

fn read_until_sentinel(mut lines: BufReader<TcpStream>) -> io::Result<Origins> {
    let mut origins = Origins::default();
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line)? == 0 {
            return Err(io::Error::other("MONITOR connection closed early"));
        }
        let Some((from_script, command)) = parse_monitor_line(&line) else {
            continue;
        };
        if command == "echo" && line.contains(SENTINEL) {
            return Ok(origins);
        }
        let entry = origins.seen.entry(command).or_default();
        if from_script {
            entry.1 += 1;
        } else {
            entry.0 += 1;
        }
    }
}

/// `+1700000000.123456 [0 lua] "hget" "k" "owner"` → `(true, "hget")`.
fn parse_monitor_line(line: &str) -> Option<(bool, String)> {
    let rest = line.strip_prefix('+')?;
    let (_, rest) = rest.split_once('[')?;
    let (origin, rest) = rest.split_once(']')?;
    let from_script = origin.split_whitespace().nth(1)? == "lua";
    let command = rest.trim_start().strip_prefix('"')?.split('"').next()?;
    Some((from_script, command.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_lines_name_their_origin() {
        assert_eq!(
            parse_monitor_line("+1796228535.907078 [0 lua] \"set\" \"a\" \"1\"\r\n"),
            Some((true, "set".into()))
        );
        assert_eq!(
            parse_monitor_line(
                "+1796228535.907030 [0 127.0.0.1:55590] \"EVALSHA\" \"ab\" \"0\"\r\n"
            ),
            Some((false, "evalsha".into()))
        );
        assert_eq!(parse_monitor_line("+OK\r\n"), None);
    }

    #[test]
    fn shares_split_commands_seen_from_both_origins() {
        let mut origins = Origins::default();
        origins.seen.insert("set".into(), (3, 1));
        origins.seen.insert("hget".into(), (0, 4));
        assert_eq!(origins.client_share("set"), 0.75);
        assert_eq!(origins.client_share("hget"), 0.0);
        assert_eq!(origins.client_share("client|setinfo"), 1.0);
        assert_eq!(origins.script_only(), vec!["hget".to_owned()]);
    }
}
