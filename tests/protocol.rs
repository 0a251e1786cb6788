//! The lock protocol's two implementations agree: the Lua scripts on a real redis-server and
//! their Rust twins, which the in-process engine runs (`engines/in_process/scripts.rs`), are
//! driven by the same seeded random operations — acquire (a single try, a first try, a waiter;
//! with a Redlock ticket; an efficiency lock's `SET NX PX` claim), release (plain, naming a
//! successor, giving a vote back; an efficiency lock's `delete_if.lua`), renew,
//! readers and permits, force-unlock, expiry of a lock, a queue entry or a set, a value
//! distlock did not write — over a few keys and owners. After every step both must have
//! answered the same reply and hold the same state: the lock value, its queue with every
//! entry, its holders, and what `inspect.lua` says.
//!
//! Tokens and times are the two servers' own clocks, so tokens are compared by their order of
//! appearance on each lock, durations within a tolerance, and the clock the twin reads is the
//! Redis server's `TIME`, taken just before each script. A failing run prints its seed; run
//! `PROTOCOL_SEED=<seed> cargo test -p distlock-tests --test protocol` to replay it.

use distlock::__private::raw::{lua_source, HolderReply, Twin};
use distlock_test_support::{RedisServer, Xorshift};
use redis::Value;
use std::collections::HashMap;
use std::fmt::Write;
use std::time::Duration;

const SEEDS: u64 = 14;
const STEPS: usize = 800;
const LOCKS: [&str; 3] = ["t:{a}", "t:{b}", "t:{c}"];
const OWNERS: [&str; 4] = ["o1", "o2", "o3", "o4"];
const SUCCESSORS: [&str; 2] = ["s1", "s2"];
const TTL_MS: u64 = 60_000;
const MARKER_TTL_MS: u64 = 3_600_000;
/// How far two durations the servers answer may differ: they are read microseconds apart.
const SLACK_MS: i64 = 25;

/// The settings one run's scripts share: what differs between one server and Redlock's masters,
/// and whether notified waiters get a reservation window.
#[derive(Debug, Clone, Copy)]
struct Mode {
    label: &'static str,
    grant_ms: u64,
    window_ms: u64,
    hands_over: bool,
    /// Exclusive locks carry tokens; `false`: efficiency locks (clock step and marker TTL 0),
    /// whose first tries are `SET NX PX` claims.
    fenced: bool,
}

impl Mode {
    /// The settings a seed runs with: one of seven, by the seed (consecutive seeds cover them
    /// all).
    fn of(seed: u64) -> Mode {
        let one_server = |label, window_ms| Mode {
            label,
            grant_ms: 60_000,
            window_ms,
            hands_over: true,
            fenced: true,
        };
        match seed % 7 {
            0 => one_server("lbl", 60_000),
            1 => one_server("web-1 (canary)", 0),
            2 => one_server(">gt", 60_000),
            3 => one_server("lbl", 0),
            // Redlock's masters: waiters queue by ticket, releases notify.
            4 => Mode {
                hands_over: false,
                ..one_server("lbl", 60_000)
            },
            // The in-process engine: nobody queues, nothing is reserved.
            5 => Mode {
                label: "lbl",
                grant_ms: 0,
                window_ms: 0,
                hands_over: true,
                fenced: true,
            },
            // Efficiency locks on one server.
            _ => Mode {
                fenced: false,
                ..one_server("lbl", 60_000)
            },
        }
    }
}

/// One operation.
#[derive(Debug, Clone)]
enum Op {
    /// An efficiency lock's first try: `SET <lock> "L0 <owner>[ <label>]" NX PX <ttl>`.
    Claim {
        lock: &'static str,
        owner: &'static str,
    },
    /// An efficiency lock's quiet release: `delete_if.lua` for the value a first try grants.
    DeleteIf {
        lock: &'static str,
        owner: &'static str,
    },
    Acquire {
        lock: &'static str,
        owner: &'static str,
        asker: u8,
        ticket: Option<u64>,
    },
    Release {
        lock: &'static str,
        owner: &'static str,
        successor: Option<(&'static str, u64, Option<u64>, bool)>,
        keeps_place: bool,
    },
    Renew {
        lock: &'static str,
        owner: &'static str,
        shared: bool,
    },
    SharedAcquire {
        lock: &'static str,
        permits: u32,
        owner: &'static str,
        asker: u8,
    },
    SharedRelease {
        lock: &'static str,
        owner: &'static str,
    },
    Unlock {
        lock: &'static str,
    },
    Expire {
        key: String,
    },
    Foreign {
        lock: &'static str,
    },
}

/// Every owner token the runs use, waiters' and successors'.
const EVERYONE: [&str; 6] = ["o1", "o2", "o3", "o4", "s1", "s2"];

impl Op {
    /// A random operation; `holders` names who holds each lock on the twin now (the exclusive
    /// holder, or the readers and permit holders), so that releases and renewals often come
    /// from the holder, as they mostly do.
    fn random(rng: &mut Xorshift, mode: Mode, twin: &mut Twin) -> Op {
        let lock = rng.pick(&LOCKS);
        let holders = holders_on(twin, lock);
        let owner = match (holders.is_empty(), rng.below(10) < 7) {
            (false, true) => rng.pick(&holders),
            _ => rng.pick(&OWNERS),
        };
        // Each lock is mostly used as one kind — `a` exclusive, `b` read/write, `c` a semaphore
        // of 2 — so that each kind's states run deep; one operation in ten crosses kinds.
        let roll = match (lock, rng.below(10)) {
            (_, 0) => rng.below(100),
            ("t:{a}", 1) => 86 + rng.below(14),
            ("t:{a}", _) => rng.below(66),
            ("t:{c}", 1) => 89 + rng.below(11),
            ("t:{c}", _) => 60 + rng.below(29),
            _ => rng.below(100),
        };
        match roll {
            0..=31 if !mode.fenced && rng.below(3) == 0 => Op::Claim { lock, owner },
            32..=59 if !mode.fenced && rng.below(3) == 0 => Op::DeleteIf { lock, owner },
            0..=31 => Op::Acquire {
                lock,
                owner,
                asker: b"0122"[rng.below(4)],
                ticket: (!mode.hands_over && rng.below(2) == 0)
                    .then(|| 1 + rng.below(OWNERS.len()) as u64),
            },
            32..=59 => {
                let successor = match rng.below(2) {
                    0 => {
                        let ttl = [TTL_MS, 0][rng.below(3).min(1)];
                        let grant = (mode.grant_ms > 0 && ttl > 0).then_some(mode.grant_ms);
                        // Going ahead of queued waiters is said with the grant time only.
                        let ahead = grant.is_some() && rng.below(4) == 0;
                        Some((rng.pick(&SUCCESSORS), ttl, grant, ahead))
                    }
                    _ => None,
                };
                Op::Release {
                    lock,
                    owner,
                    keeps_place: successor.is_none() && rng.below(6) == 0,
                    successor,
                }
            }
            60..=65 => Op::Renew {
                lock,
                owner,
                shared: rng.below(3) == 0,
            },
            66..=77 => Op::SharedAcquire {
                lock,
                permits: if lock == "t:{c}" {
                    2
                } else {
                    [0, 0, 2][rng.below(3)]
                },
                owner,
                asker: b"0122"[rng.below(4)],
            },
            78..=85 => Op::SharedRelease { lock, owner },
            86..=88 => Op::Unlock { lock },
            89..=99 if rng.below(50) == 0 => Op::Foreign { lock },
            _ => {
                let key = match rng.below(4) {
                    0 => format!("{lock}:queue"),
                    1 => format!("{lock}:queue:{owner}"),
                    2 => format!("{lock}:holders"),
                    _ => lock.to_owned(),
                };
                Op::Expire { key }
            }
        }
    }

    fn lock(&self) -> &str {
        match self {
            Op::Acquire { lock, .. }
            | Op::Claim { lock, .. }
            | Op::DeleteIf { lock, .. }
            | Op::Release { lock, .. }
            | Op::Renew { lock, .. }
            | Op::SharedAcquire { lock, .. }
            | Op::SharedRelease { lock, .. }
            | Op::Unlock { lock }
            | Op::Foreign { lock } => lock,
            Op::Expire { key } => &key[..key.find('}').map_or(key.len(), |end| end + 1)],
        }
    }
}

/// Who holds `lock` on the twin: its exclusive holder, or its readers and permit holders.
fn holders_on(twin: &mut Twin, lock: &str) -> Vec<&'static str> {
    let value = twin.get(lock).unwrap_or_default();
    let mut named: Vec<String> = value
        .split(' ')
        .skip(1)
        .take(1)
        .map(str::to_owned)
        .collect();
    for (member, _) in twin.zrange(&format!("{lock}:holders")) {
        named.extend(member.split(' ').next().map(str::to_owned));
    }
    EVERYONE
        .into_iter()
        .filter(|owner| named.iter().any(|name| name == owner))
        .collect()
}

/// What a script answered, in a form both sides share: integers, or a holder.
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    Ints(Vec<i64>),
    Holder(Option<HolderReply>),
    Error,
    Done,
}

fn member(owner: &str, mode: Mode) -> String {
    format!("{owner} {}", mode.label)
}

/// Runs `op` on the twin.
fn on_twin(twin: &mut Twin, op: &Op, mode: Mode) -> Answer {
    match op {
        Op::Claim { lock, owner } => {
            let took = twin.claim(lock, owner, TTL_MS);
            Answer::Ints(vec![i64::from(took)])
        }
        Op::DeleteIf { lock, owner } => Answer::Ints(vec![twin.delete_if(lock, owner)]),
        Op::Acquire {
            lock,
            owner,
            asker,
            ticket,
        } => Answer::Ints(twin.acquire(lock, owner, TTL_MS, *asker, *ticket).to_vec()),
        Op::Release {
            lock,
            owner,
            successor,
            keeps_place,
        } => Answer::Ints(twin.release(lock, owner, *successor, *keeps_place)),
        Op::Renew {
            lock,
            owner,
            shared,
        } => {
            let who = match shared {
                true => member(owner, mode),
                false => (*owner).to_owned(),
            };
            Answer::Ints(vec![twin.renew(lock, &who, *shared, TTL_MS)])
        }
        Op::SharedAcquire {
            lock,
            permits,
            owner,
            asker,
        } => Answer::Ints(
            twin.shared_acquire(lock, *permits, &member(owner, mode), TTL_MS, *asker)
                .to_vec(),
        ),
        Op::SharedRelease { lock, owner } => {
            Answer::Ints(vec![twin.shared_release(lock, &member(owner, mode))])
        }
        Op::Unlock { lock } => twin.unlock(lock).map_or(Answer::Error, Answer::Holder),
        Op::Expire { key } => {
            twin.expire(key);
            Answer::Done
        }
        Op::Foreign { lock } => {
            twin.set(lock, "hello");
            Answer::Done
        }
    }
}

/// The scripts loaded on the server, by name: their SHAs.
struct Scripts(HashMap<&'static str, String>);

impl Scripts {
    fn load(con: &mut redis::Connection) -> Scripts {
        let mut shas = HashMap::new();
        for name in [
            "acquire",
            "release",
            "renew",
            "shared_acquire",
            "shared_release",
            "inspect",
            "unlock",
            "delete_if",
        ] {
            let sha: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(lua_source(name))
                .query(con)
                .unwrap();
            shas.insert(name, sha);
        }
        Scripts(shas)
    }

    fn call(&self, pipe: &mut redis::Pipeline, name: &str, keys: &[&str], args: &[String]) {
        let cmd = pipe.cmd("EVALSHA").arg(&self.0[name]).arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        for arg in args {
            cmd.arg(arg);
        }
    }
}

/// Adds `op` to `pipe`, as the Lua scripts take it.
fn on_redis(pipe: &mut redis::Pipeline, scripts: &Scripts, op: &Op, mode: Mode) {
    let holders = format!("{}:holders", op.lock());
    // Efficiency locks: tokens 0 (clock step 0), released without a marker (marker TTL 0).
    let (step, marker_ms) = match mode.fenced {
        true => ("1", MARKER_TTL_MS),
        false => ("0", 0),
    };
    match op {
        Op::DeleteIf { lock, owner } => {
            let value = format!("L0 {owner} {}", mode.label);
            scripts.call(pipe, "delete_if", &[lock], &[value]);
        }
        Op::Claim { lock, owner } => {
            let value = format!("L0 {owner} {}", mode.label);
            pipe.cmd("SET")
                .arg(lock)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(TTL_MS);
        }
        Op::Acquire {
            lock,
            owner,
            asker,
            ticket,
        } => {
            let asker = match ticket {
                Some(ticket) => format!("{} {ticket}", *asker as char),
                None => (*asker as char).to_string(),
            };
            let args = [
                step.into(),
                mode.label.into(),
                mode.grant_ms.to_string(),
                (*owner).into(),
                TTL_MS.to_string(),
                asker,
            ];
            scripts.call(pipe, "acquire", &[lock], &args);
        }
        Op::Release {
            lock,
            owner,
            successor,
            keeps_place,
        } => {
            let mut per_key = (*owner).to_owned();
            if let Some((token, ttl, grant, ahead)) = successor {
                let _ = write!(per_key, " {token} {ttl}");
                if let Some(grant) = grant {
                    let _ = write!(per_key, " {grant}");
                    if *ahead {
                        per_key.push_str(" +");
                    }
                }
            }
            if *keeps_place {
                per_key.push_str(" =");
            }
            let args = [
                marker_ms.to_string(),
                mode.window_ms.to_string(),
                "PUBLISH".into(),
                String::new(),
                if mode.hands_over { "1" } else { "0" }.into(),
                per_key,
            ];
            scripts.call(pipe, "release", &[lock], &args);
        }
        Op::Renew {
            lock,
            owner,
            shared,
        } => {
            let who = match shared {
                true => format!("~{}", member(owner, mode)),
                false => (*owner).to_owned(),
            };
            scripts.call(pipe, "renew", &[lock], &[who, TTL_MS.to_string()]);
        }
        Op::SharedAcquire {
            lock,
            permits,
            owner,
            asker,
        } => {
            let letter = if *permits == 0 { "R" } else { "M" };
            let args = [
                letter.into(),
                permits.to_string(),
                member(owner, mode),
                TTL_MS.to_string(),
                (*asker as char).to_string(),
            ];
            scripts.call(pipe, "shared_acquire", &[lock, &holders], &args);
        }
        Op::SharedRelease { lock, owner } => {
            let args = [
                member(owner, mode),
                MARKER_TTL_MS.to_string(),
                mode.window_ms.to_string(),
                "PUBLISH".into(),
            ];
            scripts.call(pipe, "shared_release", &[lock, &holders], &args);
        }
        Op::Unlock { lock } => {
            let args = [MARKER_TTL_MS.to_string(), "PUBLISH".into(), "NUMSUB".into()];
            scripts.call(pipe, "unlock", &[lock], &args);
        }
        Op::Expire { key } => {
            pipe.cmd("PEXPIRE").arg(key).arg(0);
        }
        Op::Foreign { lock } => {
            pipe.cmd("SET").arg(lock).arg("hello").arg("PX").arg(60_000);
        }
    }
}

fn int(value: &Value) -> i64 {
    match value {
        Value::Int(n) => *n,
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).parse().unwrap(),
        other => panic!("not an integer: {other:?}"),
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(text) => text.clone(),
        other => panic!("not a string: {other:?}"),
    }
}

/// What the server answered `op`, read as the twin answers.
fn answer_of(op: &Op, value: &Value) -> Answer {
    match (op, value) {
        (Op::Expire { .. } | Op::Foreign { .. }, _) => Answer::Done,
        (Op::Claim { .. }, Value::Okay) => Answer::Ints(vec![1]),
        (Op::Claim { .. }, Value::Nil) => Answer::Ints(vec![0]),
        (_, Value::ServerError(_)) => Answer::Error,
        (Op::Unlock { .. }, Value::Array(fields)) => Answer::Holder(holder_of(fields)),
        (_, Value::Array(items)) => match items.as_slice() {
            [Value::Array(pair)] => Answer::Ints(pair.iter().map(int).collect()),
            items => Answer::Ints(items.iter().map(int).collect()),
        },
        (_, value) => Answer::Ints(vec![int(value)]),
    }
}

/// `inspect.lua`'s and `unlock.lua`'s fields: owner, token, PTTL, label, waited on, waiting,
/// and for a shared key how many hold it.
fn holder_of(fields: &[Value]) -> Option<HolderReply> {
    if fields.is_empty() {
        return None;
    }
    Some((
        text(&fields[0]),
        int(&fields[1]) as u64,
        int(&fields[2]),
        text(&fields[3]),
        int(&fields[4]) == 1,
        fields.get(6).map(|count| int(count) as u64),
    ))
}

/// A lock's state on one side: its value, its queue (member and score) with each entry, its
/// holders (members), and what inspect answers.
#[derive(Debug, Clone, PartialEq)]
struct LockState {
    value: Option<String>,
    queue: Vec<(String, i64, Option<String>)>,
    holders: Vec<String>,
    inspect: Option<Result<Option<HolderReply>, ()>>,
}

/// The Lua that reads a lock's state in one call (read-only: nothing it calls writes).
const DUMP: &str = r#"
local queue = redis.call('ZRANGE', KEYS[1] .. ':queue', 0, -1, 'WITHSCORES')
local entries = {}
for i = 1, #queue, 2 do
  entries[#entries + 1] = redis.call('GET', KEYS[1] .. ':queue:' .. queue[i]) or ''
end
local holders = redis.call('TYPE', KEYS[1] .. ':holders')['ok'] == 'zset'
  and redis.call('ZRANGE', KEYS[1] .. ':holders', 0, -1) or {}
local value = redis.call('TYPE', KEYS[1])['ok'] == 'string' and redis.call('GET', KEYS[1]) or ''
return {value, queue, entries, holders}
"#;

fn redis_state(dump: &Value, inspect: &Value) -> LockState {
    let Value::Array(parts) = dump else {
        panic!("dump: {dump:?}")
    };
    let value = Some(text(&parts[0])).filter(|value| !value.is_empty());
    let Value::Array(queue) = &parts[1] else {
        panic!()
    };
    let Value::Array(entries) = &parts[2] else {
        panic!()
    };
    let Value::Array(holders) = &parts[3] else {
        panic!()
    };
    let mut holders: Vec<String> = holders.iter().map(text).collect();
    holders.sort();
    let queue = queue
        .chunks(2)
        .zip(entries)
        .map(|(pair, entry)| {
            let entry = Some(text(entry)).filter(|entry| !entry.is_empty());
            (text(&pair[0]), int(&pair[1]), entry)
        })
        .collect();
    let inspect = match inspect {
        Value::ServerError(_) => Some(Err(())),
        Value::Array(fields) => Some(Ok(holder_of(fields))),
        other => panic!("inspect: {other:?}"),
    };
    LockState {
        value,
        queue,
        holders,
        inspect,
    }
}

fn twin_state(twin: &mut Twin, lock: &str) -> LockState {
    let queue = twin
        .zrange(&format!("{lock}:queue"))
        .into_iter()
        .map(|(member, score)| {
            let entry = twin.get(&format!("{lock}:queue:{member}"));
            (member, score, entry)
        })
        .collect();
    let mut holders: Vec<String> = twin
        .zrange(&format!("{lock}:holders"))
        .into_iter()
        .map(|(member, _)| member)
        .collect();
    holders.sort();
    LockState {
        value: twin.get(lock),
        queue,
        holders,
        inspect: Some(twin.inspect(lock).map_err(|_| ())),
    }
}

/// Each side's tokens by order of first appearance, per lock: a token is compared as "the
/// n-th distinct token this lock has shown".
#[derive(Default)]
struct Tokens(HashMap<(String, u64), usize>, HashMap<String, usize>);

impl Tokens {
    fn ordinal(&mut self, lock: &str, token: u64) -> usize {
        let next = self.1.entry(lock.to_owned()).or_default();
        *self.0.entry((lock.to_owned(), token)).or_insert_with(|| {
            *next += 1;
            *next
        })
    }

    /// `value` with its token replaced by its ordinal and a time (`until`) by `_`.
    fn value(&mut self, lock: &str, value: &str) -> String {
        let letter = &value[..1];
        let rest = &value[1..];
        let (token, fields) = rest.split_once(' ').unwrap_or((rest, ""));
        let Ok(token) = token.parse::<u64>() else {
            return value.to_owned();
        };
        let ordinal = self.ordinal(lock, token);
        let fields = match letter {
            "P" | "Q" | "V" | "S" => "_",
            _ => fields,
        };
        format!("{letter}#{ordinal} {fields}")
    }
}

/// `answer` with tokens replaced by ordinals and durations kept for a tolerant comparison.
fn normal_answer(tokens: &mut Tokens, lock: &str, op: &Op, answer: &Answer) -> (String, Vec<i64>) {
    match answer {
        Answer::Ints(ints) => {
            let granted = matches!(
                (op, ints.as_slice()),
                (Op::Acquire { .. } | Op::SharedAcquire { .. }, [1, _])
                    | (Op::Release { .. }, [5, _])
            );
            match ints.as_slice() {
                [code, token] if granted => (
                    format!("{code} #{}", tokens.ordinal(lock, *token as u64)),
                    vec![],
                ),
                [code, ms] => (code.to_string(), vec![(*ms).max(-1)]),
                ints => (format!("{ints:?}"), vec![]),
            }
        }
        Answer::Holder(holder) => normal_holder(tokens, lock, holder),
        other => (format!("{other:?}"), vec![]),
    }
}

fn normal_holder(
    tokens: &mut Tokens,
    lock: &str,
    holder: &Option<HolderReply>,
) -> (String, Vec<i64>) {
    match holder {
        None => ("free".into(), vec![]),
        Some((owner, token, pttl, label, waited_on, count)) => (
            format!(
                "{owner} #{} {label:?} waited {waited_on} holders {count:?}",
                tokens.ordinal(lock, *token)
            ),
            vec![*pttl],
        ),
    }
}

fn normal_state(tokens: &mut Tokens, lock: &str, state: &LockState) -> (String, Vec<i64>) {
    let value = state
        .value
        .as_deref()
        .map(|value| tokens.value(lock, value));
    let (inspect, times) = match &state.inspect {
        Some(Ok(holder)) => normal_holder(tokens, lock, holder),
        other => (format!("{other:?}"), vec![]),
    };
    (
        format!(
            "value {value:?} queue {:?} holders {:?} inspect {inspect}",
            state.queue, state.holders
        ),
        times,
    )
}

/// Durations agree within the slack (negative: none, on both sides).
fn times_agree(redis: &[i64], twin: &[i64]) -> bool {
    redis.len() == twin.len()
        && redis.iter().zip(twin).all(|(a, b)| match (*a < 0, *b < 0) {
            (true, true) => true,
            (false, false) => (a - b).abs() <= SLACK_MS,
            _ => false,
        })
}

/// How often each kind of operation got each answer: what the runs exercised.
type Seen = std::collections::BTreeMap<String, usize>;

/// The name of an answer for [`Seen`]: the operation and the script's code.
fn seen_as(op: &Op, answer: &Answer) -> String {
    let name = format!("{op:?}");
    let name = name.split([' ', '{']).next().unwrap_or_default().to_owned();
    match answer {
        Answer::Ints(ints) => format!("{name} {}", ints[0]),
        Answer::Holder(holder) => {
            format!("{name} {}", if holder.is_some() { "held" } else { "free" })
        }
        other => format!("{name} {other:?}"),
    }
}

/// One seed's run; the steps so far and where they diverged, when they did.
fn run(server: &RedisServer, seed: u64, seen: &mut Seen) -> Result<(), String> {
    let mode = Mode::of(seed);
    let client = redis::Client::open(server.url()).unwrap();
    let mut con = client.get_connection().unwrap();
    redis::cmd("FLUSHALL").query::<()>(&mut con).unwrap();
    let scripts = Scripts::load(&mut con);
    let mut twin = Twin::new(
        mode.label,
        mode.grant_ms,
        MARKER_TTL_MS,
        mode.window_ms,
        mode.hands_over,
    );
    if !mode.fenced {
        twin = twin.without_tokens();
    }
    let mut rng = Xorshift::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let (mut redis_tokens, mut twin_tokens) = (Tokens::default(), Tokens::default());
    let mut log = String::new();
    for step in 0..STEPS {
        let op = Op::random(&mut rng, mode, &mut twin);
        let lock = op.lock().to_owned();
        let mut pipe = redis::pipe();
        pipe.cmd("TIME");
        on_redis(&mut pipe, &scripts, &op, mode);
        pipe.cmd("EVAL").arg(DUMP).arg(1).arg(&lock);
        scripts.call(&mut pipe, "inspect", &[&lock], &["NUMSUB".into()]);
        let replies: Vec<Value> = pipe.ignore_errors().query(&mut con).unwrap();
        let Value::Array(time) = &replies[0] else {
            panic!("TIME: {:?}", replies[0])
        };
        twin.set_clock(int(&time[0]) as u64 * 1_000_000 + int(&time[1]) as u64);
        let twin_answer = on_twin(&mut twin, &op, mode);
        let redis_answer = answer_of(&op, &replies[1]);
        let _ = writeln!(log, "{step}: {op:?} -> {redis_answer:?}");
        *seen.entry(seen_as(&op, &redis_answer)).or_default() += 1;
        let (r, r_times) = normal_answer(&mut redis_tokens, &lock, &op, &redis_answer);
        let (t, t_times) = normal_answer(&mut twin_tokens, &lock, &op, &twin_answer);
        if r != t || !times_agree(&r_times, &t_times) {
            return Err(format!(
                "{log}step {step}: replies differ: redis {redis_answer:?} ({r}), twin \
                 {twin_answer:?} ({t})"
            ));
        }
        let redis_now = redis_state(&replies[2], &replies[3]);
        let twin_now = twin_state(&mut twin, &lock);
        let (r, r_times) = normal_state(&mut redis_tokens, &lock, &redis_now);
        let (t, t_times) = normal_state(&mut twin_tokens, &lock, &twin_now);
        if r != t || !times_agree(&r_times, &t_times) {
            return Err(format!(
                "{log}step {step}: states differ:\n  redis {redis_now:?}\n  twin  {twin_now:?}"
            ));
        }
    }
    Ok(())
}

#[test]
fn the_lua_scripts_and_their_rust_twins_agree_step_by_step() {
    let server = RedisServer::start();
    let seeds: Vec<u64> = match std::env::var("PROTOCOL_SEED") {
        Ok(seed) => vec![seed.parse().expect("PROTOCOL_SEED is a number")],
        Err(_) => {
            let base = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            (0..SEEDS).map(|i| base + i).collect()
        }
    };
    let started = std::time::Instant::now();
    let mut seen = Seen::new();
    for seed in &seeds {
        if let Err(failure) = run(&server, *seed, &mut seen) {
            panic!(
                "seed {seed} ({:?}) diverged; replay with PROTOCOL_SEED={seed}:\n{failure}",
                Mode::of(*seed)
            );
        }
    }
    eprintln!(
        "PROTOCOL {} seeds x {STEPS} steps agreed in {:?} (seeds {seeds:?}); answers seen: \
         {seen:?}",
        seeds.len(),
        started.elapsed()
    );
    if seeds.len() > 1 {
        // The runs reached every transition worth comparing: a grant, a busy lock, a place in
        // the queue kept and a new one, a reservation, a lock of another kind or not distlock's,
        // a release, a handover (with the successor queued), a transfer, a takeover, a reader
        // and a permit refused, a holder removed.
        for outcome in [
            "Acquire 1",
            "Acquire 0",
            "Acquire 4",
            "Acquire 7",
            "Acquire 3",
            "Acquire -2",
            "Acquire -3",
            "Release 1",
            "Release 3",
            "Release 6",
            "Release 5",
            "Release -1",
            "Release 0",
            "SharedAcquire 1",
            "SharedAcquire 0",
            "SharedRelease 1",
            "Renew 1",
            "Unlock held",
            "Claim 1",
            "Claim 0",
            "DeleteIf 1",
            "DeleteIf 0",
        ] {
            assert!(seen.contains_key(outcome), "no `{outcome}` in {seen:?}");
        }
    }
    assert!(started.elapsed() < Duration::from_secs(120));
}
