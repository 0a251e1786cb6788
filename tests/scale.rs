//! Waiting at scale: 10,000 tasks of one process waiting on 10,000 distinct keys at once share
//! one pub/sub connection, are all woken by release notifications, and leave no subscription,
//! queue, watch or memory behind.
//!
//! The binary counts every heap byte (a global allocator wrapping the system one), so "memory
//! back to its start" is measured, not assumed. It holds this one test, so no other test's
//! allocations are counted.

mod common;

use common::{Fixture, SingleRedis};
use distlock::__private::raw;
use distlock::{Backend, Lock, LockGuard};
use distlock_test_support::{RedisServer, Reply};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
/// Live allocations: a buffer that grows (a queue keeping its high-water capacity) stays one
/// allocation, while anything kept per waiter adds thousands.
static LIVE_ALLOCATIONS: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to `System` unchanged; only a counter is updated beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
            LIVE_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        LIVE_ALLOCATIONS.fetch_sub(1, Ordering::Relaxed);
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
            LIVE_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE_BYTES.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

fn live_allocations() -> isize {
    LIVE_ALLOCATIONS.load(Ordering::Relaxed)
}

const KEYS: usize = 10_000;
/// A waiter that missed its notification would sleep this long: none may.
const NO_POLLING: Duration = Duration::from_secs(120);

fn info_field(server: &RedisServer, section: &str, field: &str) -> i64 {
    let info = server.command(&["INFO", section]).as_str().unwrap();
    let prefix = format!("{field}:");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("INFO {section} has no {field}"))
        .trim()
        .parse()
        .unwrap()
}

/// Waits (bounded) until the server has `n` subscribed channels, re-counting each time the
/// server reports a command (a burst of SUBSCRIBEs wakes one count). The server streams every
/// command to the wait (`MONITOR`), and some thousands of counts are taken: a round's
/// "subscribed in" is about half as long again as it would be unobserved.
async fn until_channels(server: &RedisServer, n: i64, within: Duration) {
    let mut channels = 0;
    let reached = server
        .wait_until(within, async || {
            channels = info_field(server, "stats", "pubsub_channels");
            channels == n
        })
        .await;
    assert!(reached, "{channels} subscribed channels, never {n}");
}

fn pubsub_connections(server: &RedisServer) -> usize {
    let list = server
        .command(&["CLIENT", "LIST", "TYPE", "pubsub"])
        .as_str()
        .unwrap();
    list.lines().filter(|line| !line.is_empty()).count()
}

async fn take_all(backend: &Backend, keys: &[String]) -> Vec<LockGuard> {
    let mut tasks = Vec::new();
    for chunk in keys.chunks(KEYS / 8) {
        let (backend, chunk) = (backend.clone(), chunk.to_vec());
        tasks.push(tokio::spawn(async move {
            let mut guards = Vec::with_capacity(chunk.len());
            for key in chunk {
                guards.push(Lock::new(key).on(&backend).acquire().await.unwrap());
            }
            guards
        }));
    }
    let mut guards = Vec::with_capacity(keys.len());
    for task in tasks {
        guards.extend(task.await.unwrap());
    }
    guards
}

/// What one round showed.
struct Round {
    subscribed_in: Duration,
    connections: usize,
    all_woken_in: Duration,
    /// Heap growth over the round's start, at its peak and after it.
    peak: isize,
    after: isize,
    /// Allocations alive after the round that were not before it.
    allocations_after: isize,
}

/// Channels subscribed besides the keys': the waiters' process's handover channel, subscribed
/// with its notification connection and kept as long as it.
const HANDOVER_CHANNELS: i64 = 1;

/// 10,000 waiters on 10,000 keys held by `holder`, all released, all woken, all cleaned up.
async fn round(fx: &SingleRedis, holder: &Backend, waiters: &Backend, keys: &[String]) -> Round {
    let baseline = live_bytes();
    let allocations = live_allocations();
    let guards = take_all(holder, keys).await;
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(KEYS);
    for key in keys {
        let (waiters, key) = (waiters.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let guard = Lock::new(key)
                .on(&waiters)
                .wait(Duration::from_secs(600))
                .acquire()
                .await
                .unwrap();
            let acquired = Instant::now();
            guard.release().await.unwrap();
            acquired
        }));
    }
    // Bounded generously: ten thousand debug-built tasks each ask twice and subscribe (their
    // SUBSCRIBEs go out in batches), and the server streams every command to the count; this
    // takes about 3 s on a 2-core machine.
    until_channels(
        &fx.server,
        KEYS as i64 + HANDOVER_CHANNELS,
        Duration::from_secs(120),
    )
    .await;
    let subscribed_in = started.elapsed();
    let connections = pubsub_connections(&fx.server);
    let peak = live_bytes() - baseline;

    let released = Instant::now();
    let mut releases = Vec::new();
    let mut guards = guards.into_iter();
    for _ in 0..8 {
        let chunk: Vec<LockGuard> = guards.by_ref().take(KEYS / 8).collect();
        releases.push(tokio::spawn(async move {
            for guard in chunk {
                guard.release().await.unwrap();
            }
        }));
    }
    drop(guards); // its buffer, too, is the round's
    for release in releases {
        release.await.unwrap();
    }
    let mut last_wake = released;
    for task in tasks {
        last_wake = last_wake.max(task.await.unwrap());
    }
    let all_woken_in = last_wake - released;
    until_channels(&fx.server, HANDOVER_CHANNELS, Duration::from_secs(60)).await;
    for (name, client) in [("holder", holder), ("waiters", waiters)] {
        assert_eq!(raw::watched_channels(client), 0, "{name}: watches left");
        assert_eq!(raw::local_keys(client), 0, "{name}: turns left");
        assert_eq!(raw::local_waiters(client), 0, "{name}: queue entries left");
        assert_eq!(raw::watched_leases(client), 0, "{name}: leases left");
    }
    // Only the token markers (one per key, plus the warm-up's) remain on the server: the
    // queues went with their waiters.
    assert_eq!(fx.server.command(&["DBSIZE"]), Reply::Int(KEYS as i64 + 1));
    Round {
        subscribed_in,
        connections,
        all_woken_in,
        peak,
        after: live_bytes() - baseline,
        allocations_after: live_allocations() - allocations,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_waiters_on_distinct_keys_share_one_connection_and_leave_nothing() {
    // The waiters' backoff is stretched so that they do not poll; their places in the keys'
    // queues last three times as long (as a waiter's places last three of its asks), so a
    // release hands each key to its waiter.
    let fx = SingleRedis::start(|b| b.max_backoff(NO_POLLING));
    let holder = fx.backend().clone();
    let waiters = fx.contender();
    raw::set_backoff_floor(&waiters, NO_POLLING);
    let keys: Vec<String> = (0..KEYS).map(|i| format!("crowd-{i}")).collect();

    // Warm up both clients (connections, scripts, the notification link and its reader task),
    // so the baseline includes what a running service has anyway.
    let warm = Lock::new("warm-up").on(&holder).acquire().await.unwrap();
    let warming = {
        let waiters = waiters.clone();
        tokio::spawn(async move {
            Lock::new("warm-up")
                .on(&waiters)
                .wait(Duration::from_secs(30))
                .run(async {})
                .await
        })
    };
    until_channels(&fx.server, 1 + HANDOVER_CHANNELS, Duration::from_secs(10)).await;
    warm.release().await.unwrap();
    warming.await.unwrap().unwrap();
    until_channels(&fx.server, HANDOVER_CHANNELS, Duration::from_secs(10)).await;

    // Buffers keep their high-water capacity (redis-rs's per-connection request queue is a
    // VecDeque that never shrinks, sized by the most requests once in flight, which varies from
    // round to round), so bytes come back only nearly; allocations must all come back: nothing
    // is kept per waiter.
    let first = round(&fx, &holder, &waiters, &keys).await;
    let second = round(&fx, &holder, &waiters, &keys).await;
    for (name, round) in [("first", &first), ("second", &second)] {
        eprintln!(
            "SCALE {name} round: {KEYS} waiters on {KEYS} keys subscribed in {:?} over {} \
             pub/sub connection(s); all woken within {:?} of the releases; heap +{} KiB at the \
             peak, {:+} KiB and {:+} allocations after",
            round.subscribed_in,
            round.connections,
            round.all_woken_in,
            round.peak / 1024,
            round.after / 1024,
            round.allocations_after
        );
        assert_eq!(
            round.connections, 1,
            "one pub/sub connection serves every waiter"
        );
        assert!(
            round.all_woken_in < NO_POLLING / 4,
            "a waiter was woken by its backoff, not by a notification: {:?}",
            round.all_woken_in
        );
        assert!(
            round.allocations_after.abs() < KEYS as isize / 100,
            "{:+} allocations outlived the {name} round: something is kept per waiter",
            round.allocations_after
        );
    }
    assert!(
        second.after < second.peak / 20,
        "memory did not return: {:+} bytes after the second round, +{} at its peak",
        second.after,
        second.peak
    );
}
