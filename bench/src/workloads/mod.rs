//! The workloads; each file measures one (`uncontended` two) and returns its numbers as a JSON
//! object.

pub(crate) mod attribute;
pub(crate) mod contended;
pub(crate) mod counts;
pub(crate) mod etcd;
pub(crate) mod held;
pub(crate) mod mysql;
pub(crate) mod open_loop;
pub(crate) mod postgres;
pub(crate) mod redlock;
pub(crate) mod replicated;
pub(crate) mod uncontended;
pub(crate) mod zookeeper;

/// Lets every worker (task, thread or process) be started before the clock runs.
pub(crate) const START_DELAY: std::time::Duration = std::time::Duration::from_millis(50);

/// A workload's numbers for one library, or why it has none.
pub(crate) type Outcome = Result<serde_json::Map<String, serde_json::Value>, String>;

/// One library's sequential cycles (`redlock::cycles`) with what a cycle cost in CPU: in this
/// process (`client_cpu_us_per_cycle`) and in the servers (`server_field`, read by
/// `server_cpu`), for the workloads that run a peer beside distlock on servers of their own.
pub(crate) async fn cycles_with_cpu(
    client: &std::sync::Arc<crate::clients::Client>,
    duration: std::time::Duration,
    tag: &str,
    server_field: &str,
    server_cpu: impl Fn() -> std::time::Duration,
) -> Outcome {
    use crate::measure::process_cpu;
    let (client_before, server_before) = (process_cpu(), server_cpu());
    let mut outcome = redlock::cycles(client, duration, tag).await;
    let client_cpu = process_cpu().saturating_sub(client_before);
    let servers_cpu = server_cpu().saturating_sub(server_before);
    if let Ok(result) = &mut outcome {
        let cycles = result
            .get("cycles")
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(1.0);
        let per_cycle = |cpu: std::time::Duration| cpu.as_secs_f64() * 1e6 / cycles.max(1.0);
        result.insert(
            "client_cpu_us_per_cycle".into(),
            per_cycle(client_cpu).into(),
        );
        result.insert(server_field.into(), per_cycle(servers_cpu).into());
    }
    outcome
}

/// Adds `field` to every row: its `key` as a ratio to `peer`'s row.
pub(crate) fn relate_to(
    rows: &mut [(crate::clients::LibId, Outcome)],
    peer: crate::clients::LibId,
    key: &str,
    field: &str,
) {
    use serde_json::Value;
    let reference = rows.iter().find_map(|(lib, outcome)| match outcome {
        Ok(result) if *lib == peer => result.get(key).and_then(Value::as_f64),
        _ => None,
    });
    let Some(reference) = reference.filter(|rate| *rate > 0.0) else {
        return;
    };
    for (_, outcome) in rows.iter_mut() {
        if let Ok(result) = outcome {
            if let Some(rate) = result.get(key).and_then(Value::as_f64) {
                result.insert(field.into(), (rate / reference).into());
            }
        }
    }
}
