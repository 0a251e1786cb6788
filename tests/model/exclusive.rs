//! The exclusive lock on one Redis server, as clients and the server run it.
//!
//! The server is the scripts themselves: every server step restores the keyspace into the
//! in-process twin (`engines/in_process/scripts.rs`, which `tests/protocol.rs` proves answers
//! as the Lua scripts do), runs `acquire.lua`, `release.lua` or `renew.lua` at the model's
//! clock, and keeps what the script left. Expiry of the lock, of queue places and of the
//! reservation window is the keyspace's own TTLs on that clock. The client side is the
//! runtime's rules, each named where the runtime implements it; the time rules call the
//! runtime's own functions (`__private::raw::rules`).

use super::checker::Model;
use super::{owner_name, rename_clients, Faults, Interned, Server, Tick, TICK_MS};
use distlock::__private::raw::{rules, Mutation, Stored, Twin};
use std::cell::RefCell;
use std::time::Duration;

/// The lease every acquire asks for (`ttl`), and the grant time of a queue place.
const TTL_MS: u64 = 3 * TICK_MS;
/// The reservation window a release without a queued heir leaves (shorter than a tick, as
/// `RESERVATION_WINDOW`'s 10 ms is shorter than a lease).
const WINDOW_MS: u64 = TICK_MS / 2;
const MARKER_TTL_MS: u64 = 3_600_000;
/// How many owners that began asking after a waiter may be granted the lock before it: a
/// first try that meets a reservation is not queued yet, and the notified waiter the window is
/// for, and then a newcomer to the lock it freed at once, may go first. Queued, it is served
/// in order.
const OVERTAKEN: u8 = 2;
const LOCK: &str = "m:k";

/// `acquire.lua`'s "who asks": a first try that will wait, then a waiter.
const WILL_WAIT: u8 = b'1';
const WAITING: u8 = b'2';
/// Not `acquire.lua`'s: an efficiency lock's `SET NX PX` claim that took the lock, whose
/// release is `delete_if.lua` first (`node/efficiency.rs`).
const CLAIMED: u8 = b'c';

/// A client-side rule replaced by a known-bad one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientMutation {
    /// A waiter that lost its place still takes a handover message as it comes
    /// (`acquire.rs`'s `distrusts_handovers` never set).
    TrustLapsedHandover,
}

/// The exclusive lock's model and its bounds.
pub struct Exclusive {
    pub clients: usize,
    /// Acquisitions per client.
    pub cycles: u8,
    /// How many ticks a holder's body runs at most.
    pub hold: Tick,
    pub max_tick: Tick,
    pub faults: Faults,
    pub server_mutation: Option<Mutation>,
    pub client_mutation: Option<ClientMutation>,
    /// Locks carry fencing tokens; `false`: efficiency locks (`fencing_tokens(false)`), whose
    /// first try is a `SET NX PX` claim (`node/efficiency.rs`) and whose tokens are all 0.
    fenced: bool,
    twin: RefCell<Twin>,
    servers: Interned,
}

impl Exclusive {
    pub fn new(clients: usize, cycles: u8, hold: Tick, max_tick: Tick, faults: Faults) -> Self {
        Exclusive {
            clients,
            cycles,
            hold,
            max_tick,
            faults,
            server_mutation: None,
            client_mutation: None,
            fenced: true,
            twin: RefCell::new(Twin::new("", TTL_MS, MARKER_TTL_MS, WINDOW_MS, true)),
            servers: Interned::default(),
        }
    }

    /// The same model for efficiency locks: first tries claim the key with `SET NX PX`, grants
    /// carry token 0, and releases delete the key.
    pub fn without_tokens(mut self) -> Self {
        self.fenced = false;
        self.twin = RefCell::new(self.twin.into_inner().without_tokens());
        self
    }
}

/// Everything the model tracks.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    tick: Tick,
    server: Server,
    clients: Vec<Client>,
    faults: Faults,
    /// The highest fencing token the server granted.
    max_token: u64,
    /// Acquisitions begun so far (the last one's arrival).
    arrivals: u8,
    /// Owners whose release was lost: the server may name them after they moved on.
    lingering: Vec<String>,
    /// A property a step broke (found when the step ran the scripts).
    broken: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Client {
    /// Acquisitions begun; the current one's owner token is `<name><attempt>`.
    attempt: u8,
    phase: Phase,
    /// Handover messages (`G<fence> <owner>`) for the current owner, delayed: any may be taken
    /// next (reordered), and one never taken is lost.
    inbox: Vec<u64>,
    /// When this acquisition began asking, in the order of all (`None`: not waiting, or
    /// stopped asking: paused, cancelled, crashed).
    arrival: Option<u8>,
    /// Queued by the request sent at this tick (`Attempt::next`, sticky: the server may hand
    /// the lock over until told otherwise).
    next: Option<Tick>,
    /// Lost a place it had: handover messages are confirmed by asking
    /// (`Attempt::distrusts_handovers`).
    distrusts: bool,
    /// Grants to owners that began asking after it, while it waited.
    overtaken: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Phase {
    /// Between acquisitions; starts the next one by `since + 1`.
    Idle {
        since: Tick,
    },
    /// An acquire was applied at `sent`; its reply is on its way (`None`: it was lost).
    Asking {
        sent: Tick,
        asker: u8,
        reply: Option<[i64; 2]>,
    },
    /// Told to wait; asks again by `ask_by`.
    Waiting {
        ask_by: Tick,
    },
    /// Holds with `token`, relied on until `valid_until_ms`; releases by `release_by` and
    /// renews by `renew_by` (the watchdog renews every third of the lease). `quiet`: taken by
    /// an efficiency lock's claim, released by `delete_if.lua` first.
    Holding {
        token: u64,
        valid_until_ms: u64,
        release_by: Tick,
        renew_by: Tick,
        quiet: bool,
    },
    /// Does nothing until `resume_at` (a stopped process), then goes on as `then`.
    Paused {
        resume_at: Tick,
        then: Box<Phase>,
    },
    Done,
    Crashed,
}

/// One step: which client did what (or time passed).
#[derive(Debug, Clone)]
pub enum Step {
    Tick,
    Client(usize, Act),
}

#[derive(Debug, Clone, Copy)]
pub enum Act {
    Ask { lost: bool },
    Receive,
    TakeHandover(u64),
    Renew { lost: bool },
    Release { lost: bool },
    NoticeLost,
    Resume,
    Pause,
    Crash,
    Cancel,
}

impl Client {
    fn owner(&self, me: usize) -> String {
        owner_name(me, self.attempt)
    }

    /// Its acquisition waits no more (it holds, or it is over): nothing of its waiting is kept.
    fn stop_waiting(&mut self) {
        (self.arrival, self.overtaken) = (None, 0);
        self.inbox.clear();
        (self.next, self.distrusts) = (None, false);
    }

    /// The last tick this client may let pass before it must act (`None`: no duty).
    fn deadline(&self) -> Option<Tick> {
        match &self.phase {
            Phase::Idle { since } => Some(since + 1),
            Phase::Asking { sent, .. } => Some(sent + 1),
            Phase::Waiting { ask_by, .. } => Some(*ask_by),
            Phase::Holding {
                valid_until_ms,
                release_by,
                renew_by,
                ..
            } => Some((*release_by).min(*renew_by).min(ended_at(*valid_until_ms))),
            Phase::Paused { resume_at, .. } => Some(*resume_at),
            Phase::Done | Phase::Crashed => None,
        }
    }

    fn finished(&self) -> bool {
        matches!(self.phase, Phase::Done | Phase::Crashed)
    }

    /// Holds with time left on its own validity at `tick` (a paused holder too: it does not
    /// know it stopped).
    fn relies_on_lock(&self, tick: Tick) -> Option<u64> {
        let holding = match &self.phase {
            Phase::Paused { then, .. } => then.as_ref(),
            phase => phase,
        };
        match holding {
            Phase::Holding {
                token,
                valid_until_ms,
                ..
            } if ms(tick) < *valid_until_ms => Some(*token),
            _ => None,
        }
    }
}

fn ms(tick: Tick) -> u64 {
    tick as u64 * TICK_MS
}

/// The first tick at which a validity ending at `until_ms` has ended.
fn ended_at(until_ms: u64) -> Tick {
    until_ms.div_ceil(TICK_MS) as Tick
}

/// Ticks a wait of `delay` may last (a wait shorter than a tick ends within this one).
fn ticks(delay: Duration) -> Tick {
    (delay.as_millis() as u64 / TICK_MS) as Tick
}

fn valid_for(grant_ms: u64) -> u64 {
    rules::valid_for(Duration::from_millis(grant_ms), rules::DRIFT_FACTOR).as_millis() as u64
}

/// The server clock at `tick`, in µs.
fn now_us(tick: Tick) -> u64 {
    ms(tick) * 1000
}

/// The owner and token `inspect.lua` says hold the lock.
fn holder(twin: &mut Twin) -> Option<(String, u64)> {
    match twin.inspect(LOCK) {
        Ok(Some((owner, token, ..))) if !owner.is_empty() => Some((owner, token)),
        _ => None,
    }
}

impl Exclusive {
    /// Runs `script` on the server at the state's tick and keeps what it left: the keyspace,
    /// the grant it made (checked: tokens only grow; and counted against every waiter it
    /// overtook) and the handover messages it published.
    fn on_server<T>(&self, state: &mut State, script: impl FnOnce(&mut Twin) -> T) -> T {
        let mut twin = self.twin.borrow_mut();
        twin.set_mutation(self.server_mutation);
        twin.restore(&state.server.0, now_us(state.tick));
        let before = holder(&mut twin);
        let answer = script(&mut twin);
        let after = holder(&mut twin);
        let published = twin.take_published();
        state.server = self.servers.intern(twin.snapshot());
        drop(twin);
        if let Some((owner, token)) = after {
            // A new grant: another owner, or (fenced) another token for the same one.
            if before.as_ref() != Some(&(owner.clone(), token)) {
                self.granted(state, &owner, token);
            }
        }
        for (_, message) in published {
            let Some((fence, heir)) = message.strip_prefix('G').and_then(|m| m.split_once(' '))
            else {
                continue; // A release notification: waiters may ask at any time anyway.
            };
            let (heir, attempt) = super::client_of(heir);
            let client = &mut state.clients[heir];
            if client.attempt == attempt && !client.finished() {
                client.inbox.push(fence.parse().expect("a fence"));
                client.inbox.sort_unstable();
            }
        }
        answer
    }

    /// The server granted the lock to `owner` with `token`.
    fn granted(&self, state: &mut State, owner: &str, token: u64) {
        if !self.fenced && token != 0 && state.broken.is_none() {
            state.broken = Some(format!(
                "fencing: the efficiency lock of {owner} was granted token {token}, not 0"
            ));
        }
        if self.fenced && token <= state.max_token && state.broken.is_none() {
            state.broken = Some(format!(
                "fencing: {owner} was granted token {token}, not above the {} granted before",
                state.max_token
            ));
        }
        state.max_token = state.max_token.max(token);
        let (heir, attempt) = super::client_of(owner);
        let Some(came) = state.clients[heir]
            .arrival
            .filter(|_| state.clients[heir].attempt == attempt)
        else {
            return; // A handover to a waiter that stopped asking.
        };
        for (me, client) in state.clients.iter_mut().enumerate() {
            if me == heir || client.arrival.is_none_or(|mine| mine > came) {
                continue;
            }
            client.overtaken += 1;
            if client.overtaken > OVERTAKEN && state.broken.is_none() {
                state.broken = Some(format!(
                    "starvation: {} waited while {} owners that came after it were granted the \
                     lock (at most {OVERTAKEN})",
                    client.owner(me),
                    client.overtaken
                ));
            }
        }
    }

    /// An efficiency lock's first try for client `me`'s current owner, applied now:
    /// `SET NX PX`. Taken, it answers as a grant (its reply lost if `lost`); refused, the
    /// runtime sends `acquire.lua` as a first try next, in a second round trip
    /// (`node/efficiency.rs`), which is what a client with no reply does. A refused claim leaves
    /// nothing on the server: the client's place in line begins with that script (`receive`).
    fn claim(&self, state: &mut State, me: usize, lost: bool) {
        let owner = state.clients[me].owner(me);
        let took = self.on_server(state, |twin| twin.claim(LOCK, &owner, TTL_MS));
        if lost {
            state.faults.lost_replies -= 1;
        }
        if !took {
            state.clients[me].arrival = None;
        }
        state.clients[me].phase = Phase::Asking {
            sent: state.tick,
            asker: if took && !lost { CLAIMED } else { WILL_WAIT },
            reply: (took && !lost).then_some([1, 0]),
        };
    }

    /// An acquire request for client `me`'s current owner, applied now; its reply lost if
    /// `lost`.
    fn send(&self, state: &mut State, me: usize, asker: u8, lost: bool) {
        let owner = state.clients[me].owner(me);
        let reply = self.on_server(state, |twin| {
            twin.acquire(LOCK, &owner, TTL_MS, asker, None)
        });
        if lost {
            state.faults.lost_replies -= 1;
        }
        state.clients[me].phase = Phase::Asking {
            sent: state.tick,
            asker,
            reply: (!lost).then_some(reply),
        };
    }

    /// `release.lua` for client `me`'s current owner (`Lock::release`, a lost lease's release,
    /// and a dropped `Attempt`'s background release all send it); after `delete_if.lua` for a
    /// lock taken by a claim, which deletes the key if nobody waited for it since.
    fn release(&self, state: &mut State, me: usize) {
        let owner = state.clients[me].owner(me);
        let quiet = matches!(state.clients[me].phase, Phase::Holding { quiet: true, .. });
        if quiet && self.on_server(state, |twin| twin.delete_if(LOCK, &owner)) == 1 {
            return;
        }
        self.on_server(state, |twin| twin.release(LOCK, &owner, None, false));
    }

    /// Client `me`'s acquisition is over: the next one, or done.
    fn end_acquisition(&self, state: &mut State, me: usize) {
        let tick = state.tick;
        let client = &mut state.clients[me];
        client.stop_waiting();
        client.phase = match client.attempt < self.cycles {
            true => Phase::Idle { since: tick },
            false => Phase::Done,
        };
    }

    /// Client `me` holds with `token`, relied on until `until_ms`; its watchdog renews by
    /// `renew_by`.
    fn hold(&self, state: &mut State, me: usize, token: u64, until_ms: u64, renew_by: Tick) {
        let tick = state.tick;
        let client = &mut state.clients[me];
        client.stop_waiting();
        let quiet = matches!(client.phase, Phase::Asking { asker: CLAIMED, .. });
        client.phase = Phase::Holding {
            token,
            valid_until_ms: until_ms,
            release_by: tick + self.hold,
            renew_by,
            quiet,
        };
    }
}

impl Exclusive {
    /// The steps client `me` may take in `state`.
    fn acts(&self, state: &State, me: usize, out: &mut Vec<Act>) {
        let client = &state.clients[me];
        let faults = &state.faults;
        let can_lose = faults.lost_replies > 0;
        match &client.phase {
            Phase::Done | Phase::Crashed => return,
            Phase::Paused { resume_at, .. } => {
                if state.tick >= *resume_at {
                    out.push(Act::Resume);
                }
            }
            Phase::Idle { .. } => {
                out.push(Act::Ask { lost: false });
                if can_lose {
                    out.push(Act::Ask { lost: true });
                }
            }
            Phase::Asking { .. } => {
                out.push(Act::Receive);
                if faults.cancels > 0 {
                    out.push(Act::Cancel);
                }
            }
            Phase::Waiting { .. } => {
                out.push(Act::Ask { lost: false });
                if can_lose {
                    out.push(Act::Ask { lost: true });
                }
                out.extend(client.inbox.iter().map(|fence| Act::TakeHandover(*fence)));
                if faults.pauses > 0 {
                    out.push(Act::Pause);
                }
                if faults.cancels > 0 {
                    out.push(Act::Cancel);
                }
            }
            Phase::Holding {
                valid_until_ms,
                renew_by,
                ..
            } => {
                let renew_by = *renew_by;
                if ms(state.tick) >= *valid_until_ms {
                    out.push(Act::NoticeLost);
                } else {
                    out.push(Act::Release { lost: false });
                    if can_lose {
                        out.push(Act::Release { lost: true });
                    }
                    // The watchdog renews when a third of the lease has passed.
                    if state.tick >= renew_by {
                        out.push(Act::Renew { lost: false });
                        if can_lose {
                            out.push(Act::Renew { lost: true });
                        }
                    }
                    if faults.pauses > 0 {
                        out.push(Act::Pause);
                    }
                }
            }
        }
        if faults.crashes > 0 {
            out.push(Act::Crash);
        }
    }

    /// Client `me` takes step `act`.
    fn act(&self, state: &mut State, me: usize, act: Act) {
        let tick = state.tick;
        match act {
            Act::Ask { lost } => {
                let asker = match state.clients[me].phase {
                    Phase::Idle { .. } => {
                        state.arrivals += 1;
                        let client = &mut state.clients[me];
                        client.attempt += 1;
                        client.arrival = Some(state.arrivals);
                        if !self.fenced {
                            return self.claim(state, me, lost);
                        }
                        WILL_WAIT
                    }
                    _ => {
                        if state.clients[me].arrival.is_none() {
                            state.arrivals += 1;
                            state.clients[me].arrival = Some(state.arrivals);
                        }
                        WAITING
                    }
                };
                self.send(state, me, asker, lost);
            }
            Act::Receive => self.receive(state, me),
            Act::TakeHandover(fence) => self.take_handover(state, me, fence),
            Act::Renew { lost } => self.renew(state, me, lost),
            Act::Release { lost } => {
                if lost {
                    state.faults.lost_replies -= 1;
                    let owner = state.clients[me].owner(me);
                    state.lingering.push(owner);
                    state.lingering.sort();
                } else {
                    self.release(state, me);
                }
                self.end_acquisition(state, me);
            }
            Act::NoticeLost => {
                self.release(state, me);
                self.end_acquisition(state, me);
            }
            Act::Resume => {
                let Phase::Paused { then, .. } = &state.clients[me].phase else {
                    unreachable!("resumes only when paused")
                };
                // A waiter arrives anew with its next request.
                state.clients[me].phase = *then.clone();
            }
            Act::Pause => {
                state.faults.pauses -= 1;
                let then = Box::new(state.clients[me].phase.clone());
                // Long enough for its lease and its queue place to run out.
                let resume_at = tick + (TTL_MS / TICK_MS) as Tick + 1;
                let client = &mut state.clients[me];
                client.phase = Phase::Paused { resume_at, then };
                (client.arrival, client.overtaken) = (None, 0);
            }
            Act::Crash => {
                state.faults.crashes -= 1;
                let client = &mut state.clients[me];
                client.phase = Phase::Crashed;
                client.inbox.clear();
                client.arrival = None;
            }
            Act::Cancel => {
                state.faults.cancels -= 1;
                // A dropped `Attempt` releases whatever a request in flight or its queue place
                // may have been given (`impl Drop for Attempt`).
                let in_flight = matches!(state.clients[me].phase, Phase::Asking { .. });
                let placed = state.clients[me].next.is_some();
                state.clients[me].arrival = None;
                if in_flight || placed {
                    self.release(state, me);
                }
                self.end_acquisition(state, me);
            }
        }
    }
}

impl Exclusive {
    /// Client `me` reads its acquire's reply (`Request::contend`).
    fn receive(&self, state: &mut State, me: usize) {
        let tick = state.tick;
        let Phase::Asking { sent, asker, reply } = state.clients[me].phase.clone() else {
            unreachable!("receives only when asking")
        };
        let Some([code, ms_or_token]) = reply else {
            // A lost reply is retried at once with the same owner; a queued attempt distrusts
            // handovers from then on: that request may have queued it anew
            // (`Request::on_failure`).
            let client = &mut state.clients[me];
            if client.next.is_some() && self.client_mutation.is_none() {
                client.distrusts = true;
            }
            // After a refused claim, this script is the client's first word to the server.
            if client.arrival.is_none() {
                state.arrivals += 1;
                state.clients[me].arrival = Some(state.arrivals);
            }
            return self.send(state, me, asker, false);
        };
        if code == 1 {
            let until = ms(sent) + valid_for(TTL_MS);
            return self.hold(state, me, ms_or_token as u64, until, tick + 1);
        }
        let (queued, anew, reserved) = (code == 4 || code == 7, code == 7, code == 3);
        assert!(matches!(code, 0 | 3 | 4 | 7), "acquire.lua answered {code}");
        let holder_ttl = u64::try_from(ms_or_token).ok().map(Duration::from_millis);
        let client = &mut state.clients[me];
        let (mut next, mut distrusts) = (client.next, client.distrusts);
        // `Request::on_busy`: queued anew after a place it had: handovers are confirmed by
        // asking from now on (unless the mutation trusts them).
        if anew && next.is_some() && self.client_mutation.is_none() {
            distrusts = true;
        }
        if queued {
            next = Some(sent);
        }
        // `Request::wait_time`: a reservation is waited out; a queued waiter asks again within
        // `keep_place`; any other waits a backoff of at most `max_backoff` (under a tick).
        let delay = match (reserved, holder_ttl, next) {
            (true, Some(left), _) => left,
            (false, _, Some(_)) => {
                rules::keep_place(Duration::from_millis(TTL_MS), holder_ttl, None)
            }
            _ => Duration::ZERO,
        };
        (client.next, client.distrusts) = (next, distrusts);
        client.phase = Phase::Waiting {
            ask_by: tick + ticks(delay),
        };
    }
}

impl Exclusive {
    /// Client `me` reads a handover message with `fence` (`Attempt::take_handover`): taken as
    /// it comes while it has `HANDOVER_MARGIN` left of the grant counted from the request that
    /// queued it, unless the attempt distrusts handovers; otherwise it asks again at once,
    /// which confirms it.
    fn take_handover(&self, state: &mut State, me: usize, fence: u64) {
        let tick = state.tick;
        let client = &mut state.clients[me];
        client.inbox.retain(|other| *other != fence);
        let until = client.next.map(|since| ms(since) + valid_for(TTL_MS));
        let margin = rules::HANDOVER_MARGIN.as_millis() as u64;
        match until {
            Some(until) if !client.distrusts && ms(tick) + margin < until => {
                // The watchdog confirms it within the first third of the grant.
                let since = client.next.expect("queued");
                self.hold(state, me, fence, until, (since + 1).max(tick));
            }
            _ => client.phase = Phase::Waiting { ask_by: tick },
        }
    }

    /// Client `me`'s watchdog renews its lease (`renew.lua`): validity from the renewal's send
    /// time (`HeldLease::renewed`); a lock found gone or taken over is lost, and released.
    fn renew(&self, state: &mut State, me: usize, lost: bool) {
        let tick = state.tick;
        let owner = state.clients[me].owner(me);
        let answer = self.on_server(state, |twin| twin.renew(LOCK, &owner, false, TTL_MS));
        if lost {
            state.faults.lost_replies -= 1;
        }
        let Phase::Holding {
            valid_until_ms,
            renew_by,
            ..
        } = &mut state.clients[me].phase
        else {
            unreachable!("renews only when holding")
        };
        *renew_by = tick + 1;
        match (lost, answer) {
            (true, _) => {}
            (false, 1) => *valid_until_ms = (*valid_until_ms).max(ms(tick) + valid_for(TTL_MS)),
            (false, _) => {
                self.release(state, me);
                self.end_acquisition(state, me);
            }
        }
    }

    /// The holder the server names at the state's tick.
    fn server_holder(&self, state: &State, after: Tick) -> (Option<(String, u64)>, Vec<Stored>) {
        let mut twin = self.twin.borrow_mut();
        twin.restore(&state.server.0, now_us(state.tick + after));
        (holder(&mut twin), twin.snapshot())
    }
}

impl Model for Exclusive {
    type State = State;
    type Step = Step;

    fn init(&self) -> State {
        let client = Client {
            attempt: 0,
            phase: Phase::Idle { since: 0 },
            inbox: Vec::new(),
            arrival: None,
            next: None,
            distrusts: false,
            overtaken: 0,
        };
        State {
            tick: 0,
            server: Server::default(),
            clients: vec![client; self.clients],
            faults: self.faults,
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
        for me in 0..self.clients {
            acts.clear();
            self.acts(state, me, &mut acts);
            for act in &acts {
                let mut next = state.clone();
                self.act(&mut next, me, *act);
                out.push((Step::Client(me, *act), next));
            }
        }
        let everyone_done = state.clients.iter().all(Client::finished);
        let may_pass = state
            .clients
            .iter()
            .all(|client| client.deadline().is_none_or(|last| state.tick < last));
        if state.tick < self.max_tick && !everyone_done && may_pass {
            let mut next = state.clone();
            next.tick += 1;
            out.push((Step::Tick, next));
        }
    }

    fn check(&self, state: &State) -> Result<(), String> {
        if let Some(broken) = &state.broken {
            return Err(broken.clone());
        }
        let holding: Vec<String> = (0..self.clients)
            .filter_map(|me| {
                let client = &state.clients[me];
                let token = client.relies_on_lock(state.tick)?;
                Some(format!("{} (token {token})", client.owner(me)))
            })
            .collect();
        if holding.len() > 1 {
            return Err(format!(
                "exclusion: {} all hold with time left at tick {}",
                holding.join(" and "),
                state.tick
            ));
        }
        let (Some((owner, _)), _) = self.server_holder(state, 0) else {
            return Ok(());
        };
        let (me, attempt) = super::client_of(&owner);
        let client = &state.clients[me];
        let knows = match client.phase {
            Phase::Crashed => true,
            Phase::Idle { .. } | Phase::Done => false,
            _ => client.attempt == attempt,
        };
        if knows || state.lingering.contains(&owner) {
            return Ok(());
        }
        Err(format!(
            "unknown holder: the server holds the lock for {owner}, whose client has moved on \
             ({:?})",
            client.phase
        ))
    }

    fn check_end(&self, state: &State) -> Result<(), String> {
        if !self.is_end(state) {
            let waiting: Vec<String> = (0..self.clients)
                .filter(|me| !state.clients[*me].finished())
                .map(|me| {
                    format!(
                        "{} {:?}",
                        state.clients[me].owner(me),
                        state.clients[me].phase
                    )
                })
                .collect();
            return Err(format!(
                "progress: stuck at tick {} with {}",
                state.tick,
                waiting.join(", ")
            ));
        }
        // Once every lease a crashed client or a lost release left has run out.
        let faulted = state.lingering.len() + (self.faults.crashes - state.faults.crashes) as usize;
        let after = if faulted > 0 {
            (TTL_MS / TICK_MS) as Tick + 1
        } else {
            0
        };
        let (holder, keys) = self.server_holder(state, after);
        let left: Vec<&str> = keys
            .iter()
            .map(|stored| stored.key.as_str())
            .filter(|key| *key != LOCK)
            .collect();
        if holder.is_some() || !left.is_empty() {
            return Err(format!(
                "cleanup: everyone is done, and the server still has {holder:?} holding and \
                 {left:?}"
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
        let (clients, server, lingering) = rename_clients(
            &state.clients,
            &state.server,
            &state.lingering,
            &self.servers,
        );
        State {
            clients,
            server,
            lingering,
            ..state
        }
    }

    fn describe(&self, step: &Step, after: &State) -> String {
        let lock = after
            .server
            .0
            .iter()
            .find(|stored| stored.key == LOCK)
            .map_or("none".to_owned(), |stored| format!("{:?}", stored.value));
        match step {
            Step::Tick => "time passes".to_owned(),
            Step::Client(me, act) => {
                let client = &after.clients[*me];
                format!(
                    "{} {act:?} -> {:?}; lock value {lock}",
                    client.owner(*me),
                    client.phase
                )
            }
        }
    }
}
