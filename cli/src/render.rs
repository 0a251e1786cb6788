//! What the commands print: text for people, JSON (`--json`) for scripts. The owner token is a
//! credential and is never printed; the holder label says who holds a lock.

use distlock::{Backend, Finding, HeldLock, Holder, LockError, LockEvent, LockEventKind};
use serde_json::{json, Value};
use std::time::{Duration, SystemTime};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Text,
    Json,
}

pub(crate) fn inspected(format: Format, backend: &Backend, key: &str, holder: Option<&Holder>) {
    match format {
        Format::Json => {
            let mut object = holder_json(key, holder);
            object["deployment"] = json!(backend.deployment().as_str());
            println!("{object}");
        }
        Format::Text => match holder {
            Some(holder) => println!("{key}  held {}", holder_text(holder)),
            None => println!("{key}  free"),
        },
    }
}

pub(crate) fn listed(format: Format, backend: &Backend, held: &[HeldLock]) {
    match format {
        Format::Json => {
            for lock in held {
                let mut object = holder_json(&lock.key, Some(&lock.holder));
                object["deployment"] = json!(backend.deployment().as_str());
                println!("{object}");
            }
        }
        Format::Text if held.is_empty() => {
            println!("no lock held under `{}`", backend.prefix())
        }
        Format::Text => {
            for lock in held {
                println!("{}  {}", lock.key, holder_text(&lock.holder));
            }
        }
    }
}

pub(crate) fn findings(format: Format, backend: &Backend, findings: &[Finding]) {
    match format {
        Format::Json => {
            for finding in findings {
                let object = json!({
                    "check": finding.check.as_str(),
                    "advice": finding.advice,
                    "deployment": backend.deployment().as_str(),
                });
                println!("{object}");
            }
        }
        Format::Text if findings.is_empty() => {
            println!(
                "no setting of the {} backend weakens locks",
                backend.deployment()
            )
        }
        Format::Text => {
            for finding in findings {
                println!("{finding}");
            }
        }
    }
}

pub(crate) fn unlocked(format: Format, key: &str, removed: Option<&Holder>) {
    match format {
        Format::Json => {
            let mut object = holder_json(key, removed);
            object["removed"] = json!(removed.is_some());
            println!("{object}");
        }
        Format::Text => match removed {
            Some(holder) => println!("{key}  removed the lock {}", holder_text(holder)),
            None => println!("{key}  was free: nothing removed"),
        },
    }
}

pub(crate) fn event(format: Format, key: &str, event: &LockEvent) {
    let at = humantime::format_rfc3339_millis(SystemTime::now());
    let (kind, reason) = match &event.kind {
        LockEventKind::Acquired => ("acquired", None),
        LockEventKind::Renewed => ("renewed", None),
        LockEventKind::Released => ("released", None),
        LockEventKind::Expired => ("expired", None),
        LockEventKind::Evicted => ("evicted", None),
        LockEventKind::Deleted => ("deleted", None),
        LockEventKind::WaitedOn => ("waited-on", None),
        LockEventKind::Updated => ("updated", None),
        LockEventKind::Resubscribed => ("resubscribed", None),
        LockEventKind::Interrupted { reason } => ("interrupted", Some(reason.as_str())),
        LockEventKind::Other(name) => (name.as_str(), None),
        _ => ("unknown", None),
    };
    match format {
        Format::Json => {
            let mut object = holder_json(key, event.holder.as_ref());
            object["event"] = json!(kind);
            object["server"] = json!(event.server);
            object["at"] = json!(at.to_string());
            if let Some(reason) = reason {
                object["reason"] = json!(reason);
            }
            println!("{object}");
        }
        Format::Text => {
            let state = match (&event.holder, reason) {
                (_, Some(reason)) => reason.to_owned(),
                (Some(holder), None) => format!("now held {}", holder_text(holder)),
                (None, None) => "now free".to_owned(),
            };
            println!("{at}  {kind:<12} {key}  {state}  ({})", event.server);
        }
    }
}

pub(crate) fn error(format: Format, err: &LockError) {
    match format {
        Format::Json => eprintln!(
            "{}",
            json!({ "error": { "kind": error_kind(err), "message": err.to_string() } })
        ),
        Format::Text => eprintln!("distlock: {err}"),
    }
}

/// A usage error (bad flags, no URL), as [`error`] reports a lock error.
pub(crate) fn usage(format: Format, message: &str) {
    match format {
        Format::Json => eprintln!(
            "{}",
            json!({ "error": { "kind": "usage", "message": message } })
        ),
        Format::Text => eprintln!("distlock: {message}"),
    }
}

/// A stable name for the kind of error, for scripts.
fn error_kind(err: &LockError) -> &'static str {
    match err {
        LockError::Busy { .. } => "busy",
        LockError::Lost { .. } => "lost",
        LockError::NotConfigured { .. } => "not_configured",
        LockError::InvalidConfig { .. } => "invalid_config",
        LockError::InvalidKey { .. } => "invalid_key",
        LockError::Backend(_) => "backend",
        _ => "other",
    }
}

fn holder_text(holder: &Holder) -> String {
    let label = holder.label.as_deref().unwrap_or("(no label)");
    let by = match holder.shared {
        // A read lock or a semaphore: how many hold it, and one of them.
        Some(count) => format!("{count} holder(s) sharing it, one {label}"),
        None => label.to_owned(),
    };
    let waiting = match (holder.waited_on, holder.waiting) {
        (_, Some(n)) if n > 0 => format!(", {n} process(es) waiting"),
        (true, _) => ", waited on".to_owned(),
        _ => String::new(),
    };
    format!(
        "by {by}, token {}, {} left{waiting}",
        holder.fencing_token,
        human(holder.ttl)
    )
}

fn human(ttl: Duration) -> String {
    // Milliseconds are the server's resolution; more digits would be noise.
    humantime::format_duration(Duration::from_millis(ttl.as_millis() as u64)).to_string()
}

fn holder_json(key: &str, holder: Option<&Holder>) -> Value {
    match holder {
        Some(holder) => json!({
            "key": key,
            "held": true,
            "label": holder.label,
            "fencing_token": holder.fencing_token,
            "ttl_ms": holder.ttl.as_millis() as u64,
            "waited_on": holder.waited_on,
            "waiting": holder.waiting,
            "shared": holder.shared,
        }),
        None => json!({ "key": key, "held": false }),
    }
}
