//! An error with the advice that fixes its cause: the store's own words first, the advice after
//! them, and the original error kept as the source.

use std::fmt;

#[derive(Debug)]
pub(crate) struct Advised<E> {
    pub(crate) error: E,
    pub(crate) advice: String,
}

impl<E: fmt::Display> fmt::Display for Advised<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; {}", self.error, self.advice)
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Advised<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}
