//! The workloads; each file measures one (`uncontended` two) and returns its numbers as a JSON
//! object.

pub(crate) mod attribute;
pub(crate) mod contended;
pub(crate) mod etcd;
pub(crate) mod held;
pub(crate) mod open_loop;
pub(crate) mod postgres;
pub(crate) mod redlock;
pub(crate) mod replicated;
pub(crate) mod uncontended;

/// Lets every worker (task, thread or process) be started before the clock runs.
pub(crate) const START_DELAY: std::time::Duration = std::time::Duration::from_millis(50);

/// A workload's numbers for one library, or why it has none.
pub(crate) type Outcome = Result<serde_json::Map<String, serde_json::Value>, String>;
