//! Readers and a writer, or permits, on one Redis server: `shared_acquire.lua`,
//! `shared_release.lua` and `renew.lua` for readers and permits, `acquire.lua` and
//! `release.lua` for the writer, run as the scripts' twins on the model's clock (as in
//! `exclusive.rs`).
//!
//! Readers and permits do not queue: a waiting one asks again within its backoff (under a
//! tick). A waiting writer records its intent, which holds new readers back for
//! `WRITER_INTENT`, and asks again every `WRITER_RETRY` to keep it (`Request::wait_time`). A
//! writer here confirms a handover by asking (the exclusive model checks taking one as it
//! comes). The clock ticks a quarter of a second, so that the intent's half second spans two
//! ticks and its renewal comes within one, as in the runtime.

use super::checker::Model;
use super::{client_of, owner_name, rename_clients, Faults, Interned, Server, Tick};
use distlock::__private::raw::{rules, Twin};
use std::cell::RefCell;
use std::time::Duration;

const TICK_MS: u64 = 250;
const TTL_MS: u64 = 3 * TICK_MS;
const WINDOW_MS: u64 = TICK_MS / 2;
const MARKER_TTL_MS: u64 = 3_600_000;
const LOCK: &str = "m:k";
const HOLDERS: &str = "m:k:holders";
const WILL_WAIT: u8 = b'1';
const WAITING: u8 = b'2';
/// How many owners that began asking after a waiter may be granted before it (see
/// `exclusive.rs`).
const OVERTAKEN: u8 = 2;

/// What a client asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Reader,
    Writer,
    /// A permit of a semaphore of this many.
    Permit(u32),
}

/// Readers and a writer, or permits: the model and its bounds.
pub struct Shared {
    pub kinds: Vec<Kind>,
    pub cycles: u8,
    pub max_tick: Tick,
    pub faults: Faults,
    twin: RefCell<Twin>,
    servers: Interned,
}

impl Shared {
    pub fn new(kinds: Vec<Kind>, cycles: u8, max_tick: Tick, faults: Faults) -> Self {
        Shared {
            kinds,
            cycles,
            max_tick,
            faults,
            twin: RefCell::new(Twin::new("", TTL_MS, MARKER_TTL_MS, WINDOW_MS, true)),
            servers: Interned::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    tick: Tick,
    server: Server,
    clients: Vec<Client>,
    faults: Faults,
    /// The highest token granted, and whether a writer or a permit took it (readers share
    /// the token before them).
    max_token: u64,
    arrivals: u8,
    broken: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Client {
    kind: Kind,
    attempt: u8,
    phase: Phase,
    arrival: Option<u8>,
    overtaken: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Phase {
    Idle {
        since: Tick,
    },
    /// An acquire applied at `sent`; its reply on its way.
    Asking {
        sent: Tick,
        asker: u8,
        reply: [i64; 2],
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
    Ask,
    Receive,
    Renew,
    Release,
    NoticeLost,
    Pause,
    Resume,
    Crash,
}

#[derive(Debug, Clone)]
pub enum Step {
    Tick,
    Client(usize, Act),
}

fn ms(tick: Tick) -> u64 {
    tick as u64 * TICK_MS
}

fn valid_for(ttl_ms: u64) -> u64 {
    rules::valid_for(Duration::from_millis(ttl_ms), rules::DRIFT_FACTOR).as_millis() as u64
}

impl Client {
    fn owner(&self, me: usize) -> String {
        owner_name(me, self.attempt)
    }

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

    /// Its token, while it holds with time left on its own validity (paused or not).
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

/// A shared holder's member: `<owner> <label>` (no label here).
fn member(owner: &str) -> String {
    format!("{owner} ")
}

impl Shared {
    /// Runs `script` on the server at the state's tick, keeping what it left; a writer the
    /// release script handed the lock to is a grant.
    fn on_server<T>(&self, state: &mut State, script: impl FnOnce(&mut Twin) -> T) -> T {
        let mut twin = self.twin.borrow_mut();
        twin.restore(&state.server.0, ms(state.tick) * 1000);
        let writer = |twin: &mut Twin| match twin.inspect(LOCK) {
            Ok(Some((owner, token, ..))) if !owner.is_empty() => Some((owner, token)),
            _ => None,
        };
        let before = writer(&mut twin);
        let answer = script(&mut twin);
        let after = writer(&mut twin);
        twin.take_published();
        state.server = self.servers.intern(twin.snapshot());
        drop(twin);
        if let Some((owner, token)) = after {
            if before.is_none_or(|(_, was)| was != token) {
                self.granted(state, &owner, token);
            }
        }
        answer
    }

    /// `owner` was granted `token`: it must be above every token before (a reader's may equal
    /// the last: readers share it), and a waiting writer counts the grant against it if
    /// `owner` came after it.
    fn granted(&self, state: &mut State, owner: &str, token: u64) {
        let (heir, attempt) = client_of(owner);
        let reader = state.clients[heir].kind == Kind::Reader;
        let fenced = if reader {
            token >= state.max_token
        } else {
            token > state.max_token
        };
        if !fenced && state.broken.is_none() {
            state.broken = Some(format!(
                "fencing: {owner} was granted token {token} after {}",
                state.max_token
            ));
        }
        state.max_token = state.max_token.max(token);
        let came = match &state.clients[heir] {
            client if client.attempt == attempt => client.arrival,
            _ => None,
        };
        let Some(came) = came else { return };
        for (me, client) in state.clients.iter_mut().enumerate() {
            let earlier = client.arrival.is_some_and(|mine| mine < came);
            if me == heir || client.kind != Kind::Writer || !earlier {
                continue;
            }
            client.overtaken += 1;
            if client.overtaken > OVERTAKEN && state.broken.is_none() {
                state.broken = Some(format!(
                    "starvation: writer {} waited while {} owners that came after it were \
                     granted the lock (at most {OVERTAKEN})",
                    client.owner(me),
                    client.overtaken
                ));
            }
        }
    }

    /// Client `me` asks for its lock now.
    fn ask(&self, state: &mut State, me: usize, asker: u8) {
        let (kind, owner) = (state.clients[me].kind, state.clients[me].owner(me));
        let reply = self.on_server(state, |twin| match kind {
            Kind::Writer => twin.acquire(LOCK, &owner, TTL_MS, asker, None),
            Kind::Reader => twin.shared_acquire(LOCK, 0, &member(&owner), TTL_MS, asker),
            Kind::Permit(n) => twin.shared_acquire(LOCK, n, &member(&owner), TTL_MS, asker),
        });
        if kind != Kind::Writer && reply[0] == 1 {
            self.granted(state, &owner, reply[1] as u64);
        }
        // A writer waits in order from its first request that left its intent or its place
        // on the server (one answered "reserved" left neither).
        if kind == Kind::Writer && matches!(reply[0], 0 | 4 | 7) {
            let client = &mut state.clients[me];
            if client.arrival.is_none() {
                state.arrivals += 1;
                client.arrival = Some(state.arrivals);
            }
        }
        state.clients[me].phase = Phase::Asking {
            sent: state.tick,
            asker,
            reply,
        };
    }

    /// Client `me` gives its lock back (a release, or a lost lease's).
    fn release(&self, state: &mut State, me: usize) {
        let (kind, owner) = (state.clients[me].kind, state.clients[me].owner(me));
        self.on_server(state, |twin| match kind {
            Kind::Writer => twin.release(LOCK, &owner, None, false)[0],
            _ => twin.shared_release(LOCK, &member(&owner)),
        });
        let tick = state.tick;
        let client = &mut state.clients[me];
        (client.arrival, client.overtaken) = (None, 0);
        client.phase = match client.attempt < self.cycles {
            true => Phase::Idle { since: tick },
            false => Phase::Done,
        };
    }

    /// Client `me` reads its reply (`Request::contend`, `on_busy`, `wait_time`).
    fn receive(&self, state: &mut State, me: usize) {
        let tick = state.tick;
        let client = &mut state.clients[me];
        let Phase::Asking { sent, reply, .. } = client.phase else {
            unreachable!("receives only when asking")
        };
        let [code, ms_or_token] = reply;
        if code == 1 {
            (client.arrival, client.overtaken) = (None, 0);
            client.phase = Phase::Holding {
                token: ms_or_token as u64,
                valid_until_ms: ms(sent) + valid_for(TTL_MS),
                release_by: tick + 1,
                renew_by: tick + 1,
            };
            return;
        }
        assert!(matches!(code, 0 | 3 | 4 | 7), "the script answered {code}");
        let left = u64::try_from(ms_or_token).ok().map(Duration::from_millis);
        let mut delay = match (code, left) {
            (3, Some(left)) => left,
            (4 | 7, _) => rules::keep_place(Duration::from_millis(TTL_MS), left, None),
            // A backoff of at most `max_backoff`, under a tick.
            _ => Duration::ZERO,
        };
        if client.kind == Kind::Writer {
            delay = delay.min(rules::WRITER_RETRY);
        }
        let ticks = (delay.as_millis() as u64 / TICK_MS) as Tick;
        client.phase = Phase::Waiting {
            ask_by: tick + ticks,
        };
    }

    /// Client `me`'s watchdog renews (`renew.lua`); a lease found gone is lost and released.
    fn renew(&self, state: &mut State, me: usize) {
        let (kind, owner) = (state.clients[me].kind, state.clients[me].owner(me));
        let answer = self.on_server(state, |twin| match kind {
            Kind::Writer => twin.renew(LOCK, &owner, false, TTL_MS),
            _ => twin.renew(LOCK, &member(&owner), true, TTL_MS),
        });
        let tick = state.tick;
        let Phase::Holding {
            valid_until_ms,
            renew_by,
            ..
        } = &mut state.clients[me].phase
        else {
            unreachable!("renews only when holding")
        };
        *renew_by = tick + 1;
        match answer {
            1 => *valid_until_ms = (*valid_until_ms).max(ms(tick) + valid_for(TTL_MS)),
            _ => self.release(state, me),
        }
    }
}

impl Shared {
    fn acts(&self, state: &State, me: usize, out: &mut Vec<Act>) {
        let client = &state.clients[me];
        match &client.phase {
            Phase::Done | Phase::Crashed => return,
            Phase::Idle { .. } => out.push(Act::Ask),
            Phase::Asking { .. } => out.push(Act::Receive),
            Phase::Waiting { .. } => out.push(Act::Ask),
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
                    out.push(Act::Release);
                    if state.tick >= *renew_by {
                        out.push(Act::Renew);
                    }
                }
            }
        }
        let pausable = matches!(client.phase, Phase::Waiting { .. } | Phase::Holding { .. });
        if state.faults.pauses > 0 && pausable {
            out.push(Act::Pause);
        }
        if state.faults.crashes > 0 {
            out.push(Act::Crash);
        }
    }

    fn act(&self, state: &mut State, me: usize, act: Act) {
        let tick = state.tick;
        match act {
            Act::Ask => {
                let asker = match state.clients[me].phase {
                    Phase::Idle { .. } => {
                        let client = &mut state.clients[me];
                        client.attempt += 1;
                        if client.kind != Kind::Writer {
                            state.arrivals += 1;
                            client.arrival = Some(state.arrivals);
                        }
                        WILL_WAIT
                    }
                    _ => {
                        let client = &mut state.clients[me];
                        if client.kind != Kind::Writer && client.arrival.is_none() {
                            state.arrivals += 1;
                            client.arrival = Some(state.arrivals);
                        }
                        WAITING
                    }
                };
                self.ask(state, me, asker);
            }
            Act::Receive => self.receive(state, me),
            Act::Renew => self.renew(state, me),
            Act::Release | Act::NoticeLost => self.release(state, me),
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
                // A waiter arrives anew with its next request.
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

    /// The writer `inspect.lua` names and the live shared holders, at `tick`.
    fn holders(&self, state: &State, tick: Tick) -> (Option<String>, Vec<String>, usize) {
        let mut twin = self.twin.borrow_mut();
        twin.restore(&state.server.0, ms(tick) * 1000);
        let writer = match twin.inspect(LOCK) {
            Ok(Some((owner, ..))) if !owner.is_empty() => Some(owner),
            _ => None,
        };
        let now_ms = ms(tick) as i64;
        let shared = twin
            .zrange(HOLDERS)
            .into_iter()
            .filter(|(_, expiry)| *expiry > now_ms)
            .map(|(member, _)| member.trim_end().to_owned())
            .collect();
        let keys = twin.snapshot().len();
        (writer, shared, keys)
    }
}

impl Model for Shared {
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
            server: Server::default(),
            clients,
            faults: self.faults,
            max_token: 0,
            arrivals: 0,
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
        let done = self.is_end(state);
        let may_pass = state
            .clients
            .iter()
            .all(|client| client.deadline().is_none_or(|last| state.tick < last));
        if state.tick < self.max_tick && !done && may_pass {
            let mut next = state.clone();
            next.tick += 1;
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
            let named = holding
                .iter()
                .map(|(me, token)| format!("{} (token {token})", state.clients[*me].owner(*me)));
            named.collect::<Vec<_>>().join(", ")
        };
        let writer = holding
            .iter()
            .any(|(me, _)| state.clients[*me].kind == Kind::Writer);
        if writer && holding.len() > 1 {
            return Err(format!(
                "exclusion: a writer and others hold at once: {}",
                names()
            ));
        }
        if let Some(Kind::Permit(n)) = self.kinds.first() {
            if holding.len() > *n as usize {
                return Err(format!("permits: more than {n} hold at once: {}", names()));
            }
        }
        let (writer, shared, _) = self.holders(state, state.tick);
        for owner in writer.iter().chain(shared.iter()) {
            let (me, attempt) = client_of(owner);
            let client = &state.clients[me];
            let knows = match client.phase {
                Phase::Crashed => true,
                Phase::Idle { .. } | Phase::Done => false,
                _ => client.attempt == attempt,
            };
            if !knows {
                return Err(format!(
                    "unknown holder: the server counts {owner} a holder, whose client has \
                     moved on ({:?})",
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
        let crashed = self.faults.crashes > state.faults.crashes;
        let after = if crashed {
            (TTL_MS / TICK_MS) as Tick + 1
        } else {
            0
        };
        let (writer, shared, keys) = self.holders(state, state.tick + after);
        if writer.is_some() || !shared.is_empty() || keys > 1 {
            return Err(format!(
                "cleanup: everyone is done, and the server still has {writer:?} {shared:?} \
                 and {keys} keys"
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

    fn canonical(&self, state: State) -> State {
        let (clients, server, _) =
            rename_clients(&state.clients, &state.server, &[], &self.servers);
        State {
            clients,
            server,
            ..state
        }
    }

    fn describe(&self, step: &Step, after: &State) -> String {
        let lock = after
            .server
            .0
            .iter()
            .map(|stored| format!("{} = {:?}", stored.key, stored.value))
            .collect::<Vec<_>>()
            .join("; ");
        match step {
            Step::Tick => "time passes".to_owned(),
            Step::Client(me, act) => {
                let client = &after.clients[*me];
                format!(
                    "{} {act:?} -> {:?}; {lock}",
                    client.owner(*me),
                    client.phase
                )
            }
        }
    }
}
