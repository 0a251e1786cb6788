//! Small measurement tools: percentiles, medians, clocks.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The `q`-quantile (0..=1) of `sorted` by the nearest-rank method; 0 for no samples.
pub(crate) fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median of `values`; the mean of the middle two for an even count; `None` when empty.
pub(crate) fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    })
}

/// Nanoseconds to microseconds, for reports.
pub(crate) fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// Wall-clock nanoseconds. Timestamps of the contended workload come from several processes,
/// which share this clock (and not `Instant`'s); intervals of a few µs to a few seconds are all
/// it measures, so clock slewing does not matter.
pub(crate) fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64)
}

/// Busy work of length `length`: a critical section that holds the CPU, not the scheduler.
pub(crate) fn spin(length: Duration) {
    if length.is_zero() {
        return;
    }
    let end = std::time::Instant::now() + length;
    while std::time::Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// CPU time of this process so far (user + system, all threads).
pub(crate) fn process_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `rusage` through a valid pointer to one; RUSAGE_SELF cannot
    // fail on Linux, and the zeroed value is a valid `rusage` in any case.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// CPU time (user + system) process `pid` has used, from `/proc/<pid>/stat`; zero where it
/// cannot be read.
pub(crate) fn cpu_of(pid: u32) -> Duration {
    // utime and stime: the 14th and 15th fields of the line.
    stat_cpu(pid, 11, 12)
}

/// CPU time (user + system) the children of process `pid` used that have ended and been waited
/// for, from `/proc/<pid>/stat`; zero where it cannot be read.
pub(crate) fn ended_children_cpu_of(pid: u32) -> Duration {
    // cutime and cstime: the 16th and 17th fields of the line.
    stat_cpu(pid, 13, 14)
}

/// The parent of process `pid`, from `/proc/<pid>/stat`.
pub(crate) fn parent_of(pid: u32) -> Option<u32> {
    // ppid: the 4th field of the line.
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// The sum of two clock-tick fields of `/proc/<pid>/stat` (numbered as in [`stat_fields`]), as a
/// duration; zero where they cannot be read.
fn stat_cpu(pid: u32, user: usize, system: usize) -> Duration {
    let fields = stat_fields(pid).unwrap_or_default();
    let ticks = |at: usize| {
        fields
            .get(at)
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_micros((ticks(user) + ticks(system)) * 1_000_000 / per_second)
}

/// The fields of `/proc/<pid>/stat` after the command name (which may hold spaces, inside
/// parentheses): the line's 3rd field is the first of them.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, after) = stat.rsplit_once(')')?;
    Some(after.split_whitespace().map(str::to_owned).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let sorted: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&sorted, 0.5), 50);
        assert_eq!(quantile(&sorted, 0.99), 99);
        assert_eq!(quantile(&sorted, 1.0), 100);
        assert_eq!(quantile(&[7], 0.99), 7);
        assert_eq!(quantile(&[], 0.5), 0);
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&mut []), None);
    }

    #[test]
    fn this_process_is_read_back_from_proc() {
        let me = std::process::id();
        assert_eq!(parent_of(me), Some(std::os::unix::process::parent_id()));
        spin(Duration::from_millis(30));
        assert!(cpu_of(me) > Duration::ZERO);
        assert_eq!(parent_of(u32::MAX), None);
    }

    #[test]
    fn process_cpu_advances_with_work() {
        let before = process_cpu();
        spin(Duration::from_millis(30));
        assert!(process_cpu() > before);
    }
}
