//! The entry-queue engine (etcd, PostgreSQL): every contender writes one entry, numbered in the
//! store's order and bound to a time the store keeps; who holds follows from the order alone,
//! decided by the engine's own `order::holds` (`__private::raw::rules::queue_holds`); a holder's
//! number is its fencing token.
//!
//! The store is modelled from the `Store` trait's contract (`engines/queue/store.rs`): a join
//! keeps an entry that is there (its time starts again) or appends one with the next number,
//! and reads the queue in the same step; a leave deletes; a renewal starts an entry's time
//! again; an entry whose time ends is deleted. A waiter is woken by deletions ahead of it
//! (`watches.rs`); as those may come late or not at all (a broken link), it also asks again
//! within `keep_place` — here, at any time before that.

use super::checker::Model;
use super::{owner_name, Faults, Tick};
use distlock::__private::raw::rules;
use distlock::LockKind;
use std::time::Duration;

const TICK_MS: u64 = 1000;
const TTL_MS: u64 = 3 * TICK_MS;

/// The queue engine's model and its bounds.
pub struct Queue {
    pub kinds: Vec<LockKind>,
    pub cycles: u8,
    pub max_tick: Tick,
    pub faults: Faults,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    tick: Tick,
    /// The queue, in the store's order.
    entries: Vec<Entry>,
    /// The last number the store gave.
    numbered: u64,
    clients: Vec<Client>,
    faults: Faults,
    /// The highest token a writer learnt it holds with, and the highest of all.
    writer_token: u64,
    max_token: u64,
    arrivals: u8,
    /// Entries whose leave was lost: they stay until their time ends.
    lingering: Vec<(usize, u8)>,
    broken: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Entry {
    client: usize,
    attempt: u8,
    number: u64,
    expires_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Client {
    kind: LockKind,
    attempt: u8,
    phase: Phase,
    arrival: Option<u8>,
    overtaken: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Phase {
    Idle {
        since: Tick,
    },
    /// A join applied at `sent`: its answer (`Some(token)`: holds) on its way, or lost.
    Asking {
        sent: Tick,
        reply: Option<Option<u64>>,
    },
    Waiting {
        ask_by: Tick,
    },
    Holding {
        token: u64,
        valid_until_ms: u64,
        release_by: Tick,
        renew_by: Tick,
    },
    Paused {
        resume_at: Tick,
        then: Box<Phase>,
    },
    Done,
    Crashed,
}

#[derive(Debug, Clone, Copy)]
pub enum Act {
    Join { lost: bool },
    Receive,
    Renew,
    Leave { lost: bool },
    NoticeLost,
    Pause,
    Resume,
    Crash,
    Cancel,
}

#[derive(Debug, Clone)]
pub enum Step {
    Tick,
    Client(usize, Act),
}

fn ms(tick: Tick) -> u64 {
    tick as u64 * TICK_MS
}

fn valid_for() -> u64 {
    rules::valid_for(Duration::from_millis(TTL_MS), rules::DRIFT_FACTOR).as_millis() as u64
}

impl Client {
    fn finished(&self) -> bool {
        matches!(self.phase, Phase::Done | Phase::Crashed)
    }

    fn deadline(&self) -> Option<Tick> {
        match &self.phase {
            Phase::Idle { since } => Some(since + 1),
            Phase::Asking { sent, .. } => Some(sent + 1),
            Phase::Waiting { ask_by } => Some(*ask_by),
            Phase::Holding {
                valid_until_ms,
                release_by,
                renew_by,
                ..
            } => Some(
                (*release_by)
                    .min(*renew_by)
                    .min(valid_until_ms.div_ceil(TICK_MS) as Tick),
            ),
            Phase::Paused { resume_at, .. } => Some(*resume_at),
            Phase::Done | Phase::Crashed => None,
        }
    }

    fn relies_on_lock(&self, tick: Tick) -> Option<u64> {
        let phase = match &self.phase {
            Phase::Paused { then, .. } => then.as_ref(),
            phase => phase,
        };
        match phase {
            Phase::Holding {
                token,
                valid_until_ms,
                ..
            } if ms(tick) < *valid_until_ms => Some(*token),
            _ => None,
        }
    }
}

impl State {
    /// The entries whose time has not ended at the state's tick (a store deletes the others).
    fn expire(&mut self) {
        let now = ms(self.tick);
        self.entries.retain(|entry| entry.expires_ms > now);
        self.lingering.retain(|(client, attempt)| {
            self.entries
                .iter()
                .any(|e| e.client == *client && e.attempt == *attempt)
        });
    }

    fn place(&self, client: usize, attempt: u8) -> Option<usize> {
        self.entries
            .iter()
            .position(|entry| entry.client == client && entry.attempt == attempt)
    }

    /// Whether the entry at `place` holds the lock (`order::holds`, the engine's own).
    fn holds(&self, place: usize) -> bool {
        let kinds: Vec<Option<LockKind>> = self
            .entries
            .iter()
            .map(|entry| Some(self.clients[entry.client].kind))
            .collect();
        rules::queue_holds(&kinds, place)
    }
}

impl Queue {
    /// Client `me` joins (or keeps its place) and reads the queue in the same step
    /// (`Store::join`, `QueueEngine::join`): `Some(token)` when its entry holds the lock.
    fn join(&self, state: &mut State, me: usize, lost: bool) {
        let (attempt, now) = (state.clients[me].attempt, ms(state.tick));
        let place = match state.place(me, attempt) {
            Some(place) => {
                state.entries[place].expires_ms = now + TTL_MS;
                place
            }
            None => {
                state.numbered += 1;
                state.entries.push(Entry {
                    client: me,
                    attempt,
                    number: state.numbered,
                    expires_ms: now + TTL_MS,
                });
                state.entries.len() - 1
            }
        };
        let answer = state.holds(place).then_some(state.entries[place].number);
        if lost {
            state.faults.lost_replies -= 1;
        }
        state.clients[me].phase = Phase::Asking {
            sent: state.tick,
            reply: (!lost).then_some(answer),
        };
    }

    /// Client `me`'s entry deleted (`Store::leave`), unless the leave is lost; the acquisition
    /// ends.
    fn leave(&self, state: &mut State, me: usize, lost: bool) {
        let attempt = state.clients[me].attempt;
        match lost {
            true => {
                state.faults.lost_replies -= 1;
                if state.place(me, attempt).is_some() {
                    state.lingering.push((me, attempt));
                }
            }
            false => state
                .entries
                .retain(|entry| (entry.client, entry.attempt) != (me, attempt)),
        }
        let tick = state.tick;
        let client = &mut state.clients[me];
        (client.arrival, client.overtaken) = (None, 0);
        client.phase = match client.attempt < self.cycles {
            true => Phase::Idle { since: tick },
            false => Phase::Done,
        };
    }

    /// Client `me` learnt it holds with `token`: above every writer's before it, and a writer's
    /// above every token before it; and any waiter that came earlier was overtaken.
    fn granted(&self, state: &mut State, me: usize, token: u64) {
        let writer = state.clients[me].kind == LockKind::Exclusive;
        let floor = if writer {
            state.max_token
        } else {
            state.writer_token
        };
        if token <= floor && state.broken.is_none() {
            state.broken = Some(format!(
                "fencing: {} learnt it holds with token {token}, not above {floor}",
                owner_name(me, state.clients[me].attempt)
            ));
        }
        state.max_token = state.max_token.max(token);
        if writer {
            state.writer_token = state.writer_token.max(token);
        }
        let Some(came) = state.clients[me].arrival else {
            return;
        };
        // An earlier waiter whose entry holds too is granted with it (readers, permits).
        let served: Vec<bool> = (0..state.clients.len())
            .map(|other| {
                let place = state.place(other, state.clients[other].attempt);
                place.is_some_and(|place| state.holds(place))
            })
            .collect();
        let heir = owner_name(me, state.clients[me].attempt);
        for (other, client) in state.clients.iter_mut().enumerate() {
            let earlier = client.arrival.is_some_and(|mine| mine < came);
            if other != me && earlier && !served[other] {
                client.overtaken += 1;
                if state.broken.is_none() {
                    state.broken = Some(format!(
                        "order: {heir} was granted the lock before {}, which came earlier",
                        owner_name(other, client.attempt)
                    ));
                }
            }
        }
    }

    fn receive(&self, state: &mut State, me: usize) {
        let tick = state.tick;
        let Phase::Asking { sent, reply } = state.clients[me].phase.clone() else {
            unreachable!("receives only when asking")
        };
        match reply {
            // A lost answer: asked again at once with the same owner (`Request::on_failure`).
            None => self.join(state, me, false),
            Some(Some(token)) => {
                self.granted(state, me, token);
                let client = &mut state.clients[me];
                (client.arrival, client.overtaken) = (None, 0);
                client.phase = Phase::Holding {
                    token,
                    valid_until_ms: ms(sent) + valid_for(),
                    release_by: tick + 1,
                    renew_by: tick + 1,
                };
            }
            Some(None) => {
                let head = state.entries.first().map(|entry| entry.expires_ms);
                let left = head.map(|end| Duration::from_millis(end.saturating_sub(ms(tick))));
                let delay = rules::keep_place(Duration::from_millis(TTL_MS), left, None);
                let ask_by = tick + (delay.as_millis() as u64 / TICK_MS) as Tick;
                state.clients[me].phase = Phase::Waiting { ask_by };
            }
        }
    }

    /// Client `me`'s watchdog renews its entry (`Store::renew`); one found gone is lost.
    fn renew(&self, state: &mut State, me: usize) {
        let (tick, attempt) = (state.tick, state.clients[me].attempt);
        let Some(place) = state.place(me, attempt) else {
            return self.leave(state, me, false);
        };
        state.entries[place].expires_ms = ms(tick) + TTL_MS;
        if let Phase::Holding {
            valid_until_ms,
            renew_by,
            ..
        } = &mut state.clients[me].phase
        {
            *valid_until_ms = (*valid_until_ms).max(ms(tick) + valid_for());
            *renew_by = tick + 1;
        }
    }
}

impl Queue {
    fn acts(&self, state: &State, me: usize, out: &mut Vec<Act>) {
        let client = &state.clients[me];
        let faults = &state.faults;
        let lose = faults.lost_replies > 0;
        match &client.phase {
            Phase::Done | Phase::Crashed => return,
            Phase::Idle { .. } | Phase::Waiting { .. } => {
                out.push(Act::Join { lost: false });
                if lose {
                    out.push(Act::Join { lost: true });
                }
            }
            Phase::Asking { .. } => out.push(Act::Receive),
            Phase::Paused { resume_at, .. } => {
                if state.tick >= *resume_at {
                    out.push(Act::Resume);
                }
            }
            Phase::Holding {
                valid_until_ms,
                renew_by,
                ..
            } => {
                if ms(state.tick) >= *valid_until_ms {
                    out.push(Act::NoticeLost);
                } else {
                    out.push(Act::Leave { lost: false });
                    if lose {
                        out.push(Act::Leave { lost: true });
                    }
                    if state.tick >= *renew_by {
                        out.push(Act::Renew);
                    }
                }
            }
        }
        let waiting = matches!(client.phase, Phase::Waiting { .. } | Phase::Asking { .. });
        if faults.cancels > 0 && waiting {
            out.push(Act::Cancel);
        }
        let pausable = matches!(client.phase, Phase::Waiting { .. } | Phase::Holding { .. });
        if faults.pauses > 0 && pausable {
            out.push(Act::Pause);
        }
        if faults.crashes > 0 {
            out.push(Act::Crash);
        }
    }

    fn act(&self, state: &mut State, me: usize, act: Act) {
        let tick = state.tick;
        match act {
            Act::Join { lost } => {
                let client = &mut state.clients[me];
                if let Phase::Idle { .. } = client.phase {
                    client.attempt += 1;
                }
                // A waiter that paused arrives anew with its next request.
                if client.arrival.is_none() {
                    state.arrivals += 1;
                    client.arrival = Some(state.arrivals);
                }
                self.join(state, me, lost);
            }
            Act::Receive => self.receive(state, me),
            Act::Renew => self.renew(state, me),
            Act::Leave { lost } => self.leave(state, me, lost),
            Act::NoticeLost => self.leave(state, me, false),
            Act::Cancel => {
                state.faults.cancels -= 1;
                self.leave(state, me, false);
            }
            Act::Pause => {
                state.faults.pauses -= 1;
                let client = &mut state.clients[me];
                let then = Box::new(client.phase.clone());
                let resume_at = tick + (TTL_MS / TICK_MS) as Tick + 1;
                client.phase = Phase::Paused { resume_at, then };
                (client.arrival, client.overtaken) = (None, 0);
            }
            Act::Resume => {
                let client = &mut state.clients[me];
                let Phase::Paused { then, .. } = &client.phase else {
                    unreachable!("resumes only when paused")
                };
                client.phase = *then.clone();
            }
            Act::Crash => {
                state.faults.crashes -= 1;
                let client = &mut state.clients[me];
                client.phase = Phase::Crashed;
                client.arrival = None;
            }
        }
    }
}

impl Model for Queue {
    type State = State;
    type Step = Step;

    fn init(&self) -> State {
        let clients = self
            .kinds
            .iter()
            .map(|kind| Client {
                kind: *kind,
                attempt: 0,
                phase: Phase::Idle { since: 0 },
                arrival: None,
                overtaken: 0,
            })
            .collect();
        State {
            tick: 0,
            entries: Vec::new(),
            numbered: 0,
            clients,
            faults: self.faults,
            writer_token: 0,
            max_token: 0,
            arrivals: 0,
            lingering: Vec::new(),
            broken: None,
        }
    }

    fn next(&self, state: &State, out: &mut Vec<(Step, State)>) {
        if state.broken.is_some() {
            return;
        }
        let mut acts = Vec::new();
        for me in 0..state.clients.len() {
            acts.clear();
            self.acts(state, me, &mut acts);
            for act in &acts {
                let mut next = state.clone();
                self.act(&mut next, me, *act);
                out.push((Step::Client(me, *act), next));
            }
        }
        let may_pass = state
            .clients
            .iter()
            .all(|client| client.deadline().is_none_or(|last| state.tick < last));
        let settled = self.is_end(state) && state.entries.is_empty();
        if state.tick < self.max_tick && !settled && may_pass {
            let mut next = state.clone();
            next.tick += 1;
            next.expire();
            out.push((Step::Tick, next));
        }
    }

    fn check(&self, state: &State) -> Result<(), String> {
        if let Some(broken) = &state.broken {
            return Err(broken.clone());
        }
        let holding: Vec<(usize, u64)> = (0..state.clients.len())
            .filter_map(|me| Some((me, state.clients[me].relies_on_lock(state.tick)?)))
            .collect();
        let names = || {
            let named = holding.iter().map(|(me, token)| {
                format!(
                    "{} (token {token})",
                    owner_name(*me, state.clients[*me].attempt)
                )
            });
            named.collect::<Vec<_>>().join(", ")
        };
        let writer = holding
            .iter()
            .any(|(me, _)| state.clients[*me].kind == LockKind::Exclusive);
        if writer && holding.len() > 1 {
            return Err(format!(
                "exclusion: a writer and others hold at once: {}",
                names()
            ));
        }
        if let Some(LockKind::Permits(n)) = self.kinds.first() {
            if holding.len() > *n as usize {
                return Err(format!("permits: more than {n} hold at once: {}", names()));
            }
        }
        for (place, entry) in state.entries.iter().enumerate() {
            let client = &state.clients[entry.client];
            let knows = match client.phase {
                Phase::Crashed => true,
                Phase::Idle { .. } | Phase::Done => false,
                _ => client.attempt == entry.attempt,
            };
            let lingering = state.lingering.contains(&(entry.client, entry.attempt));
            if state.holds(place) && !knows && !lingering {
                return Err(format!(
                    "unknown holder: the entry of {} holds the lock, and its client has moved \
                     on ({:?})",
                    owner_name(entry.client, entry.attempt),
                    client.phase
                ));
            }
        }
        Ok(())
    }

    fn check_end(&self, state: &State) -> Result<(), String> {
        if !self.is_end(state) {
            return Err(format!("progress: stuck at tick {}", state.tick));
        }
        if !state.entries.is_empty() {
            return Err(format!(
                "cleanup: everyone is done, and the queue still has {:?}",
                state.entries
            ));
        }
        Ok(())
    }

    fn is_end(&self, state: &State) -> bool {
        state.clients.iter().all(Client::finished)
    }

    fn tick(&self, state: &State) -> u32 {
        state.tick
    }

    /// The store's numbers matter only in their order: they are renumbered from 1.
    fn canonical(&self, mut state: State) -> State {
        let mut numbers: Vec<u64> = state.entries.iter().map(|entry| entry.number).collect();
        for client in &state.clients {
            if let Some(token) = client.relies_on_lock(0).or(match &client.phase {
                Phase::Holding { token, .. } => Some(*token),
                Phase::Asking {
                    reply: Some(Some(token)),
                    ..
                } => Some(*token),
                _ => None,
            }) {
                numbers.push(token);
            }
        }
        numbers.extend([state.writer_token, state.max_token, state.numbered]);
        numbers.sort_unstable();
        numbers.dedup();
        let rank = |number: u64| numbers.binary_search(&number).expect("collected") as u64;
        for entry in &mut state.entries {
            entry.number = rank(entry.number);
        }
        for client in &mut state.clients {
            let phase = match &mut client.phase {
                Phase::Paused { then, .. } => then.as_mut(),
                phase => phase,
            };
            match phase {
                Phase::Holding { token, .. } => *token = rank(*token),
                Phase::Asking {
                    reply: Some(Some(token)),
                    ..
                } => *token = rank(*token),
                _ => {}
            }
        }
        state.writer_token = rank(state.writer_token);
        state.max_token = rank(state.max_token);
        state.numbered = rank(state.numbered);
        state
    }

    fn describe(&self, step: &Step, after: &State) -> String {
        let queue: Vec<String> = after
            .entries
            .iter()
            .map(|e| format!("{}#{}", owner_name(e.client, e.attempt), e.number))
            .collect();
        match step {
            Step::Tick => format!("time passes; queue {queue:?}"),
            Step::Client(me, act) => {
                let client = &after.clients[*me];
                let owner = owner_name(*me, client.attempt);
                format!("{owner} {act:?} -> {:?}; queue {queue:?}", client.phase)
            }
        }
    }
}
