//! Workload 5: what `#[distributed_lock]` costs over the programmatic API, on the in-process
//! backend (no network, so the difference is the generated code alone).
//!
//! Three variants run the same two-statement critical section under the same lock:
//! - `attribute`: the annotated function (key rendered by the template, a checkpoint between
//!   the statements, the registry looked up by name);
//! - `programmatic`: `Lock::new(format!(…)).backend(name).run(…)`, the same lookup by name;
//! - `programmatic_handle`: `Lock::new(…).on(&backend).run(…)`, no registry;
//! - `programmatic_fixed`: the same with a fixed lease, which skips the watchdog: what the
//!   watchdog registration costs per call.
//!
//! They are interleaved round by round (so drift hits all alike); each round times `calls`
//! sequential calls of one variant. The calls cycle through [`KEYS`] keys: distinct keys would
//! grow the in-process backend's fence counters (kept for an hour), and its periodic sweep over
//! them would then dominate every variant alike. The result is the median over rounds of ns per call, and the
//! median of the per-round differences.

use crate::measure::median;
use distlock::{distributed_lock, Backend, Lease, Lock, LockError, Registry};
use serde_json::{Map, Value};
use std::hint::black_box;
use std::sync::OnceLock;
use std::time::Instant;

const BACKEND: &str = "bench-attribute";
/// Distinct keys the calls cycle through.
const KEYS: u64 = 1024;

/// The error type of the locked functions.
#[derive(Debug)]
pub(crate) struct BenchError(#[allow(dead_code)] LockError);

impl From<LockError> for BenchError {
    fn from(err: LockError) -> Self {
        BenchError(err)
    }
}

#[distributed_lock(key = "attr:<id>", backend = "bench-attribute", lease = "watchdog")]
async fn attributed(id: u64) -> Result<u64, BenchError> {
    let doubled = black_box(id).wrapping_mul(2);
    Ok(black_box(doubled + 1))
}

async fn programmatic(id: u64) -> Result<u64, BenchError> {
    Lock::new(format!("attr:{id}"))
        .backend(BACKEND)
        .lease(Lease::Watchdog)
        .run(async move {
            let doubled = black_box(id).wrapping_mul(2);
            Ok(black_box(doubled + 1))
        })
        .await?
}

async fn programmatic_handle(backend: &Backend, id: u64) -> Result<u64, BenchError> {
    Lock::new(format!("attr:{id}"))
        .on(backend)
        .lease(Lease::Watchdog)
        .run(async move {
            let doubled = black_box(id).wrapping_mul(2);
            Ok(black_box(doubled + 1))
        })
        .await?
}

async fn programmatic_fixed(backend: &Backend, id: u64) -> Result<u64, BenchError> {
    Lock::new(format!("attr:{id}"))
        .on(backend)
        .lease(Lease::Fixed(crate::clients::FIXED_TTL))
        .run(async move {
            let doubled = black_box(id).wrapping_mul(2);
            Ok(black_box(doubled + 1))
        })
        .await?
}

fn backend() -> Result<Backend, String> {
    static BACKEND_HANDLE: OnceLock<Result<Backend, String>> = OnceLock::new();
    BACKEND_HANDLE
        .get_or_init(|| {
            let backend = Backend::in_process();
            Registry::global()
                .register(BACKEND, backend.clone())
                .map_err(|e| e.to_string())?;
            Ok(backend)
        })
        .clone()
}

#[derive(Clone, Copy)]
enum Variant {
    Attribute,
    Programmatic,
    ProgrammaticHandle,
    ProgrammaticFixed,
}

async fn round(
    variant: Variant,
    backend: &Backend,
    calls: usize,
    base: u64,
) -> Result<f64, String> {
    let started = Instant::now();
    for i in 0..calls as u64 {
        let id = (base + i) % KEYS;
        let value = match variant {
            Variant::Attribute => attributed(id).await,
            Variant::Programmatic => programmatic(id).await,
            Variant::ProgrammaticHandle => programmatic_handle(backend, id).await,
            Variant::ProgrammaticFixed => programmatic_fixed(backend, id).await,
        }
        .map_err(|e| format!("locked call failed: {e:?}"))?;
        black_box(value);
    }
    Ok(started.elapsed().as_nanos() as f64 / calls as f64)
}

pub(crate) async fn run(rounds: usize, calls: usize) -> Result<Map<String, Value>, String> {
    let backend = backend()?;
    // Warm-up: the watchdog task, the allocator, the caches.
    for variant in [
        Variant::Attribute,
        Variant::Programmatic,
        Variant::ProgrammaticHandle,
        Variant::ProgrammaticFixed,
    ] {
        round(variant, &backend, calls.min(1000), 0).await?;
    }
    let (mut attribute, mut named, mut handle) = (Vec::new(), Vec::new(), Vec::new());
    let mut fixed = Vec::new();
    let (mut over_named, mut over_handle) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let base = (r * calls) as u64 * 4;
        let a = round(Variant::Attribute, &backend, calls, base).await?;
        let p = round(Variant::Programmatic, &backend, calls, base + calls as u64).await?;
        let h = round(
            Variant::ProgrammaticHandle,
            &backend,
            calls,
            base + 2 * calls as u64,
        )
        .await?;
        let f = round(
            Variant::ProgrammaticFixed,
            &backend,
            calls,
            base + 3 * calls as u64,
        )
        .await?;
        fixed.push(f);
        attribute.push(a);
        named.push(p);
        handle.push(h);
        over_named.push(a - p);
        over_handle.push(a - h);
    }
    let mut result = Map::new();
    let mut put = |name: &str, values: &mut Vec<f64>| {
        result.insert(name.into(), median(values).unwrap_or(f64::NAN).into());
    };
    put("attribute_ns", &mut attribute);
    put("programmatic_ns", &mut named);
    put("programmatic_handle_ns", &mut handle);
    put("programmatic_fixed_ns", &mut fixed);
    put("overhead_ns", &mut over_named);
    put("overhead_vs_handle_ns", &mut over_handle);
    result.insert("rounds".into(), rounds.into());
    result.insert("calls_per_round".into(), calls.into());
    Ok(result)
}
