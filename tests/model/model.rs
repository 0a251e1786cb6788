//! The lock protocol, model-checked: every interleaving of a few clients on one key, explored
//! breadth-first and exhaustively within the bounds below — requests, replies that are lost,
//! handover messages delayed, reordered or lost, leases and queue places that run out on a
//! discrete clock, a client that pauses, one that crashes, a call that is cancelled.
//!
//! The server side is the code that runs: the scripts' Rust twins on the in-process keyspace
//! (`engines/in_process/scripts.rs`; `tests/protocol.rs` proves they answer as the Lua scripts
//! do), and for the entry-queue engine its own `order::holds`. The client side is the runtime's
//! rules, named where they are implemented. docs/design.md ("The protocol, model-checked")
//! says what is checked, the bounds, and what lies outside them.
//!
//! Each model's numbers (states, time, memory) are printed: run with `--nocapture` to see them.
//! `DISTLOCK_MODEL_BOUND=large` explores the larger bounds (minutes, not seconds).

mod checker;
mod exclusive;
mod queue;
mod shared;

use checker::{explore, Model, Report};
use distlock::__private::raw::{Mutation, Stored, StoredValue};
use distlock::LockKind;
use exclusive::{ClientMutation, Exclusive};
use queue::Queue;
use shared::{Kind, Shared};
use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;

/// The model's clock: whole ticks of `TICK_MS`.
pub type Tick = u32;
pub const TICK_MS: u64 = 1000;

/// What may go wrong in one run, each at most this many times.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Faults {
    /// Replies lost (the request was applied), and releases lost (it was not).
    pub lost_replies: u8,
    /// A process stopped for longer than its lease, waiting or holding.
    pub pauses: u8,
    pub crashes: u8,
    /// Calls dropped while they wait.
    pub cancels: u8,
}

/// The owner token of client `me`'s `attempt`th acquisition: `a1`, `b2`, …
pub fn owner_name(me: usize, attempt: u8) -> String {
    format!("{}{attempt}", (b'a' + me as u8) as char)
}

/// The client and acquisition of an owner token.
pub fn client_of(owner: &str) -> (usize, u8) {
    let me = (owner.as_bytes()[0] - b'a') as usize;
    (me, owner[1..].parse().expect("an attempt number"))
}

/// A server's keyspace as a state holds it, shared by every state that has the same one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Server(pub Rc<[Stored]>);

/// The keyspaces seen so far, each kept once.
#[derive(Default)]
pub struct Interned(RefCell<HashSet<Rc<[Stored]>>>);

impl Interned {
    pub fn intern(&self, stored: Vec<Stored>) -> Server {
        let mut seen = self.0.borrow_mut();
        if let Some(found) = seen.get(stored.as_slice()) {
            return Server(found.clone());
        }
        let stored: Rc<[Stored]> = stored.into();
        seen.insert(stored.clone());
        Server(stored)
    }
}

/// Every order of `n` things: `order[new] = old`.
fn orders(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut all = Vec::new();
    for shorter in orders(n - 1) {
        for at in 0..n {
            let mut order = shorter.clone();
            order.insert(at, n - 1);
            all.push(order);
        }
    }
    all
}

/// `text` with every client's letter replaced by its new one (`letters[old] = new`).
fn renamed(text: &str, letters: &[u8]) -> String {
    text.bytes()
        .map(|byte| match byte.checked_sub(b'a') {
            Some(old) if (old as usize) < letters.len() => (b'a' + letters[old as usize]) as char,
            _ => byte as char,
        })
        .collect()
}

/// The server's keyspace with the clients renamed: owner tokens (`a1`) appear in keys, lock
/// values, queue members and entries, and nowhere else is there a lower-case `a`, `b` or `c`.
fn renamed_server(server: &[Stored], letters: &[u8]) -> Vec<Stored> {
    let mut stored: Vec<Stored> = server
        .iter()
        .map(|one| Stored {
            key: renamed(&one.key, letters),
            value: match &one.value {
                StoredValue::String(value) => StoredValue::String(renamed(value, letters)),
                StoredValue::SortedSet(members) => {
                    let mut members: Vec<(i64, String)> = members
                        .iter()
                        .map(|(score, member)| (*score, renamed(member, letters)))
                        .collect();
                    members.sort();
                    StoredValue::SortedSet(members)
                }
            },
            expires_us: one.expires_us,
        })
        .collect();
    stored.sort();
    stored
}

/// Symmetry reduction: the clients reordered (and renamed everywhere) into the least order of
/// all, so that states equal up to the clients' names are one state.
pub fn rename_clients<C: Ord + Clone>(
    clients: &[C],
    server: &Server,
    lingering: &[String],
    interned: &Interned,
) -> (Vec<C>, Server, Vec<String>) {
    let reordered =
        |order: &[usize]| -> Vec<C> { order.iter().map(|old| clients[*old].clone()).collect() };
    let all = orders(clients.len());
    let least = all
        .iter()
        .map(|order| reordered(order))
        .min()
        .expect("one order at least");
    let mut best: Option<(Vec<Stored>, Vec<String>)> = None;
    let mut identity_is_least = false;
    for order in all.iter().filter(|order| reordered(order) == least) {
        if order.iter().enumerate().all(|(new, old)| new == *old) {
            identity_is_least = true;
        }
        let mut letters = vec![0u8; order.len()];
        for (new, old) in order.iter().enumerate() {
            letters[*old] = new as u8;
        }
        let stored = renamed_server(&server.0, &letters);
        let mut owners: Vec<String> = lingering.iter().map(|o| renamed(o, &letters)).collect();
        owners.sort();
        if best
            .as_ref()
            .is_none_or(|best| (&stored, &owners) < (&best.0, &best.1))
        {
            best = Some((stored, owners));
        }
    }
    let (stored, owners) = best.expect("one order at least");
    if identity_is_least && *stored == *server.0 && owners == lingering {
        return (least, server.clone(), owners);
    }
    (least, interned.intern(stored), owners)
}

/// Time is not bounded by the model but by what the clients do (each starts its next
/// acquisition within a tick, holds for a bounded time, and waits only behind holders): every
/// run ends long before this. A run that reaches it is stuck: a livelock.
const TIME_LIMIT: Tick = 48;

/// No model here comes near this; one that does has bounds too large to finish.
const STATE_LIMIT: usize = 30_000_000;

fn large() -> bool {
    std::env::var("DISTLOCK_MODEL_BOUND").is_ok_and(|bound| bound == "large")
}

/// Explores `model` and prints what it found.
fn run<M: Model>(name: &str, model: &M) -> Report {
    let report = explore(model, STATE_LIMIT);
    println!("{name}: {report}");
    if let Some(violation) = &report.violation {
        println!("{violation}");
    }
    report
}

fn holds(name: &str, model: &impl Model) {
    let report = run(name, model);
    if let Some(violation) = report.violation {
        panic!("{name}: {violation}");
    }
}

/// The model must find `property` broken (a known-bad transition is in place).
fn breaks(name: &str, model: &impl Model, property: &str) {
    let report = run(name, model);
    match report.violation {
        Some(violation) if violation.property.starts_with(property) => {}
        other => panic!("{name}: expected {property:?} broken, found {other:?}"),
    }
}

/// Every fault at most once.
const ALL_FAULTS: Faults = Faults {
    lost_replies: 1,
    pauses: 1,
    crashes: 1,
    cancels: 1,
};

const PAUSE: Faults = Faults {
    lost_replies: 0,
    pauses: 1,
    crashes: 0,
    cancels: 0,
};

/// Explores the exclusive lock with `clients` clients of `cycles` acquisitions each.
fn exclusive_holds(clients: usize, cycles: u8, faults: Faults) {
    let model = Exclusive::new(clients, cycles, 1, TIME_LIMIT, faults);
    holds(
        &format!("exclusive, {clients} clients x {cycles}, {faults:?}"),
        &model,
    );
}

#[test]
fn the_exclusive_lock_is_safe_fenced_fifo_and_cleans_up() {
    match large() {
        true => exclusive_holds(3, 3, Faults::default()),
        false => exclusive_holds(3, 2, Faults::default()),
    }
}

#[test]
fn the_exclusive_lock_holds_through_every_fault() {
    match large() {
        true => exclusive_holds(
            3,
            2,
            Faults {
                lost_replies: 1,
                ..PAUSE
            },
        ),
        false => exclusive_holds(3, 1, ALL_FAULTS),
    }
}

#[test]
fn the_exclusive_lock_holds_through_every_fault_twice_over() {
    let crash_and_cancel = Faults {
        crashes: 1,
        cancels: 1,
        ..Faults::default()
    };
    match large() {
        true => exclusive_holds(3, 2, crash_and_cancel),
        false => exclusive_holds(2, 2, ALL_FAULTS),
    }
}

/// Efficiency locks: a first try claims the key with `SET NX PX`, without reading the queue.
#[test]
fn the_efficiency_lock_is_safe_fifo_and_cleans_up_through_every_fault() {
    let model = |clients, cycles, faults| {
        Exclusive::new(clients, cycles, 1, TIME_LIMIT, faults).without_tokens()
    };
    let (plain, faulty) = match large() {
        true => (model(3, 3, Faults::default()), model(3, 2, ALL_FAULTS)),
        false => (model(3, 2, Faults::default()), model(3, 1, ALL_FAULTS)),
    };
    holds("efficiency lock, no faults", &plain);
    holds("efficiency lock, every fault", &faulty);
}

#[test]
fn a_queue_that_records_only_its_first_waiter_starves_the_third_client() {
    let mut model = Exclusive::new(3, 3, 1, TIME_LIMIT, Faults::default());
    model.server_mutation = Some(Mutation::FirstWaiterOnly);
    breaks("exclusive, first waiter only", &model, "starvation");
}

#[test]
fn trusting_a_handover_for_a_lapsed_place_breaks_exclusion() {
    let mut model = Exclusive::new(3, 2, 1, TIME_LIMIT, PAUSE);
    model.client_mutation = Some(ClientMutation::TrustLapsedHandover);
    breaks("exclusive, trusting a lapsed handover", &model, "exclusion");
}

#[test]
fn a_release_that_ignores_the_owner_breaks_exclusion() {
    let mut model = Exclusive::new(3, 1, 1, TIME_LIMIT, PAUSE);
    model.server_mutation = Some(Mutation::ReleaseIgnoresOwner);
    breaks(
        "exclusive, a release that ignores the owner",
        &model,
        "exclusion",
    );
}

/// Two readers and a writer, then three holders of a semaphore of two: (kinds, acquisitions
/// each, faults).
fn shared_bounds() -> Vec<(Vec<Kind>, u8, Faults)> {
    let rw = vec![Kind::Reader, Kind::Reader, Kind::Writer];
    let permits = vec![Kind::Permit(2); 3];
    let crash_and_pause = Faults {
        crashes: 1,
        ..PAUSE
    };
    match large() {
        true => vec![(rw, 2, crash_and_pause), (permits, 2, crash_and_pause)],
        false => vec![
            (rw.clone(), 2, Faults::default()),
            (rw, 1, crash_and_pause),
            (permits.clone(), 2, Faults::default()),
            (permits, 1, crash_and_pause),
        ],
    }
}

#[test]
fn readers_share_a_writer_is_not_starved_and_permits_are_counted() {
    for (kinds, cycles, faults) in shared_bounds() {
        let name = format!("shared, {kinds:?} x {cycles}, {faults:?}");
        holds(&name, &Shared::new(kinds, cycles, TIME_LIMIT, faults));
    }
}

/// The entry-queue engine's bounds: (kinds, acquisitions each, faults).
fn queue_bounds() -> Vec<(Vec<LockKind>, u8, Faults)> {
    let writers = vec![LockKind::Exclusive; 3];
    let rw = vec![LockKind::Read, LockKind::Read, LockKind::Exclusive];
    let permits = vec![LockKind::Permits(2); 3];
    match large() {
        true => vec![
            (writers, 2, ALL_FAULTS),
            (rw, 2, ALL_FAULTS),
            (permits, 2, ALL_FAULTS),
        ],
        false => vec![
            (writers.clone(), 2, Faults::default()),
            (writers, 1, ALL_FAULTS),
            (rw.clone(), 2, Faults::default()),
            (rw, 1, ALL_FAULTS),
            (permits.clone(), 2, Faults::default()),
            (permits, 1, ALL_FAULTS),
        ],
    }
}

#[test]
fn the_entry_queue_is_safe_fenced_in_order_and_cleans_up() {
    for (kinds, cycles, faults) in queue_bounds() {
        let model = Queue {
            kinds: kinds.clone(),
            cycles,
            max_tick: TIME_LIMIT,
            faults,
        };
        holds(&format!("queue, {kinds:?} x {cycles}, {faults:?}"), &model);
    }
}
