//! [`Xorshift`]: a tiny reproducible generator for tests and the benchmark, so that a schedule
//! drawn from a printed seed can be drawn again.

use std::time::Duration;

/// Marsaglia's xorshift64 (shifts 13, 7, 17). Not for anything but reproducible test schedules.
#[derive(Debug, Clone)]
pub struct Xorshift(u64);

impl Xorshift {
    /// A generator from `seed` (its lowest bit is set: a zero state would stay zero).
    pub fn new(seed: u64) -> Xorshift {
        Xorshift(seed | 1)
    }

    /// A generator seeded from the clock, and its seed, to print so that a failure can be replayed
    /// with [`Xorshift::new`].
    pub fn from_clock() -> (Xorshift, u64) {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the clock is after 1970")
            .as_nanos() as u64
            | 1;
        (Xorshift::new(seed), seed)
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Below `bound` (which must not be 0).
    pub fn below(&mut self, bound: usize) -> usize {
        (self.next_u64() % bound as u64) as usize
    }

    /// One of `from` (which must not be empty).
    pub fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len())]
    }

    /// A duration below `bound` (0 for a zero bound), to the nanosecond.
    pub fn duration_below(&mut self, bound: Duration) -> Duration {
        Duration::from_nanos(self.next_u64() % bound.as_nanos().max(1) as u64)
    }

    /// Uniform in (0, 1].
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_draws_the_same_schedule() {
        let mut a = Xorshift::new(42);
        let mut b = Xorshift::new(43); // the same state: the lowest bit is set either way
        let drawn: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        assert_eq!(drawn, (0..4).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(drawn[0], drawn[1]);
        assert!((0..1000).all(|_| a.below(7) < 7));
        assert!((0..1000).all(|_| (0.0..=1.0).contains(&a.unit()) && a.unit() > 0.0));
        assert!(a.duration_below(Duration::from_micros(20)) < Duration::from_micros(20));
        assert_eq!(a.duration_below(Duration::ZERO), Duration::ZERO);
    }
}
