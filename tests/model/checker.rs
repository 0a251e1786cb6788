//! An explicit-state model checker: breadth-first search over every state a [`Model`] can
//! reach from its initial one, exhaustive within the model's own bounds (no sampling, no
//! hashing away of states: each is kept whole and compared whole).
//!
//! In every reachable state it checks the model's safety properties; at every state with no
//! successor, the model's end condition (everyone done, nothing left on the server); and over
//! the whole graph, that from every reachable state some path still leads to an end (nothing
//! can be stuck for ever: no deadlock, no lost wake-up, no livelock). A violation comes back
//! as the shortest path to it, one line per step.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// A protocol as a graph of states.
pub trait Model {
    type State: Clone + Eq + Hash + Debug;
    /// One step: who did what (small; described only when a trace is printed).
    type Step: Clone + Debug;

    /// The state everything starts in.
    fn init(&self) -> Self::State;

    /// Every step `state` allows, with the state it leads to.
    fn next(&self, state: &Self::State, out: &mut Vec<(Self::Step, Self::State)>);

    /// A step in one line, as a trace shows it (`after`: the state it led to).
    fn describe(&self, step: &Self::Step, after: &Self::State) -> String;

    /// The safety properties: `Err` names the one `state` breaks.
    fn check(&self, state: &Self::State) -> Result<(), String>;

    /// A state with no successor: `Err` unless everyone is done and nothing is left behind.
    fn check_end(&self, state: &Self::State) -> Result<(), String>;

    /// Whether `state` is an end (everyone done): what every reachable state must still be
    /// able to reach.
    fn is_end(&self, state: &Self::State) -> bool;

    /// The time a state is at, for the trace (`tick`).
    fn tick(&self, state: &Self::State) -> u32;

    /// The one state that stands for every state equal to `state` up to a renaming of the
    /// clients (symmetry reduction; by default, `state` itself).
    fn canonical(&self, state: Self::State) -> Self::State {
        state
    }
}

/// What a search found.
#[derive(Debug)]
pub struct Report {
    pub states: usize,
    pub transitions: usize,
    pub ends: usize,
    pub elapsed: Duration,
    /// The largest resident set of the process so far, in MiB (`/proc/self/status`).
    pub peak_mib: u64,
    /// The first property broken, with the path to it.
    pub violation: Option<Violation>,
}

/// A broken property and the shortest path that breaks it.
#[derive(Debug)]
pub struct Violation {
    pub property: String,
    pub trace: Vec<String>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.property)?;
        for (step, line) in self.trace.iter().enumerate() {
            writeln!(f, "  {step:>3}. {line}")?;
        }
        Ok(())
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} states, {} transitions, {} ends, {:.1} s, peak RSS {} MiB",
            self.states,
            self.transitions,
            self.ends,
            self.elapsed.as_secs_f64(),
            self.peak_mib
        )
    }
}

/// One reached state: the state it was first reached from, and its successors.
struct Node {
    parent: u32,
    successors: Vec<u32>,
}

/// Explores every state `model` can reach, checking its properties; stops at the first
/// violation, or when more than `limit` states are reached (a bound too large to finish).
pub fn explore<M: Model>(model: &M, limit: usize) -> Report {
    let started = Instant::now();
    let mut index: HashMap<Rc<M::State>, u32> = HashMap::new();
    let mut states: Vec<Rc<M::State>> = Vec::new();
    let mut nodes: Vec<Node> = Vec::new();
    let init = Rc::new(model.init());
    index.insert(init.clone(), 0);
    states.push(init);
    nodes.push(Node {
        parent: u32::MAX,
        successors: Vec::new(),
    });
    let (mut transitions, mut ends) = (0, 0);
    let mut out = Vec::new();
    let mut at = 0;
    let found = |property: String, at: usize, states: &[Rc<M::State>], nodes: &[Node]| {
        let (trace, concrete) = trace(model, states, nodes, at);
        // The replayed state names the clients as the trace does.
        let property = match concrete.map(|last| model.check(&last)) {
            Some(Err(named)) => named,
            _ => property,
        };
        Some(Violation { property, trace })
    };
    let mut violation = None;
    while at < states.len() {
        let state = states[at].clone();
        if let Err(broken) = model.check(&state) {
            violation = found(broken, at, &states, &nodes);
            break;
        }
        out.clear();
        model.next(&state, &mut out);
        if out.is_empty() {
            ends += 1;
            if let Err(broken) = model.check_end(&state) {
                violation = found(broken, at, &states, &nodes);
                break;
            }
        }
        for (_, next) in out.drain(..) {
            transitions += 1;
            let next = Rc::new(model.canonical(next));
            let id = match index.get(&next) {
                Some(&id) => id,
                None => {
                    let id = states.len() as u32;
                    index.insert(next.clone(), id);
                    states.push(next);
                    nodes.push(Node {
                        parent: at as u32,
                        successors: Vec::new(),
                    });
                    id
                }
            };
            nodes[at].successors.push(id);
        }
        if states.len() > limit {
            violation = Some(Violation {
                property: format!("more than {limit} states: the bound is too large"),
                trace: Vec::new(),
            });
            break;
        }
        at += 1;
        if at % (1 << 18) == 0 && std::env::var_os("DISTLOCK_MODEL_PROGRESS").is_some() {
            eprintln!(
                "{at} of {} states, {:.0} s, {} MiB",
                states.len(),
                started.elapsed().as_secs_f64(),
                peak_rss_mib()
            );
        }
    }
    if violation.is_none() {
        if let Some(stuck) = stuck_state(model, &states, &nodes) {
            violation = found(
                "progress: from this state no path leads to everyone done".into(),
                stuck,
                &states,
                &nodes,
            );
        }
    }
    Report {
        states: states.len(),
        transitions,
        ends,
        elapsed: started.elapsed(),
        peak_mib: peak_rss_mib(),
        violation,
    }
}

/// The first reached state (the one with the shortest path) from which no end can be reached.
fn stuck_state<M: Model>(model: &M, states: &[Rc<M::State>], nodes: &[Node]) -> Option<usize> {
    let mut predecessors: Vec<Vec<u32>> = vec![Vec::new(); nodes.len()];
    for (from, node) in nodes.iter().enumerate() {
        for &to in &node.successors {
            predecessors[to as usize].push(from as u32);
        }
    }
    let mut live = vec![false; nodes.len()];
    let mut work: Vec<u32> = Vec::new();
    for (id, state) in states.iter().enumerate() {
        if model.is_end(state) {
            live[id] = true;
            work.push(id as u32);
        }
    }
    while let Some(id) = work.pop() {
        for &before in &predecessors[id as usize] {
            if !live[before as usize] {
                live[before as usize] = true;
                work.push(before);
            }
        }
    }
    live.iter().position(|live| !live)
}

/// The path from the initial state to `at`, one line per step, each with the time it
/// happened at. The states kept are canonical (clients renamed), so the path is replayed from
/// the initial state to name every client as it was named at the start.
fn trace<M: Model>(
    model: &M,
    states: &[Rc<M::State>],
    nodes: &[Node],
    at: usize,
) -> (Vec<String>, Option<M::State>) {
    let mut path = Vec::new();
    let mut id = at;
    while nodes[id].parent != u32::MAX {
        path.push(id);
        id = nodes[id].parent as usize;
    }
    path.reverse();
    let mut concrete = model.init();
    let mut lines = Vec::new();
    let mut out = Vec::new();
    for id in path {
        out.clear();
        model.next(&concrete, &mut out);
        let target = &*states[id];
        // A state that broke a property keeps its names in the message: the step that broke
        // the same property stands for it.
        let same = |next: &M::State| match model.check(target) {
            Err(broken) if nodes[id].successors.is_empty() => model
                .check(next)
                .is_err_and(|other| other.split(':').next() == broken.split(':').next()),
            _ => model.canonical(next.clone()) == *target,
        };
        let found = out.drain(..).find(|(_, next)| same(next));
        let Some((step, next)) = found else {
            lines.push("(the path could not be replayed)".to_owned());
            return (lines, None);
        };
        let tick = model.tick(&concrete);
        lines.push(format!("tick {tick}: {}", model.describe(&step, &next)));
        concrete = next;
    }
    (lines, Some(concrete))
}

/// The process's peak resident set in MiB (`VmHWM`), 0 where `/proc` cannot say.
fn peak_rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}
