//! Tables that give memory back: a `HashMap` keeps its largest capacity forever, so the tables
//! that grow with a burst (waiters on many keys, leases held at once) shrink once they are
//! three-quarters empty. Amortised: a shrink halves the table at most once per many removals.

use std::collections::HashMap;
use std::hash::Hash;

/// Tables up to this capacity are left as they are.
const SHRINK_ABOVE: usize = 64;

/// Shrinks `table` to twice its length once it is three-quarters empty; call it after removals.
pub(crate) fn shrink_when_sparse<K: Eq + Hash, V>(table: &mut HashMap<K, V>) {
    let (len, capacity) = (table.len(), table.capacity());
    if capacity > SHRINK_ABOVE && len * 4 < capacity {
        table.shrink_to(len * 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_emptied_after_a_burst_gives_its_memory_back() {
        let mut table: HashMap<u32, u32> = (0..10_000).map(|i| (i, i)).collect();
        let peak = table.capacity();
        for i in 0..10_000 {
            table.remove(&i);
            shrink_when_sparse(&mut table);
        }
        assert!(
            table.capacity() <= SHRINK_ABOVE,
            "{} of {peak}",
            table.capacity()
        );
        let mut small: HashMap<u32, u32> = (0..10).map(|i| (i, i)).collect();
        let before = small.capacity();
        small.remove(&0);
        shrink_when_sparse(&mut small);
        assert_eq!(small.capacity(), before, "small tables are left alone");
    }
}
