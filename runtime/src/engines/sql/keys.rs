//! The keys of lock names a database store read back.

use crate::lock::key::key_of;

/// The keys `locks` (lock names under `prefix`) were made from; a name that is not one is
/// skipped.
pub(crate) fn keys_of(prefix: &str, locks: &[String]) -> Vec<String> {
    locks
        .iter()
        .filter_map(|lock| key_of(prefix, lock))
        .map(str::to_owned)
        .collect()
}
