//! The errors of one attribute: every phase pushes what it finds and keeps going, so that a user
//! with three mistakes sees three errors in one build. A leaf: every phase imports it.
//!
//! The collector must be checked: dropping it unchecked panics (as serde_derive's `Ctxt` does),
//! so no phase's errors can be lost on the way to the output.

use proc_macro2::Span;
use syn::Error;

pub(crate) struct Errors {
    found: Option<Error>,
    checked: bool,
}

impl Errors {
    pub(crate) fn new() -> Errors {
        Errors {
            found: None,
            checked: false,
        }
    }

    pub(crate) fn push(&mut self, error: Error) {
        match &mut self.found {
            Some(all) => all.combine(error),
            None => self.found = Some(error),
        }
    }

    /// Ends the collection: `value`, what the phases built, if none of them found an error; the
    /// errors, all combined, if any did. A phase that built nothing must have said why; should
    /// one not have, the user gets an error asking for a report, never a panic.
    pub(crate) fn check<T>(mut self, value: Option<T>) -> Result<T, Error> {
        self.checked = true;
        match (self.found.take(), value) {
            (Some(errors), _) => Err(errors),
            (None, Some(value)) => Ok(value),
            (None, None) => Err(Error::new(
                Span::call_site(),
                "distributed_lock could not read this function but found nothing wrong with it; \
                 this is a bug of distlock-macros: please report it with the function",
            )),
        }
    }
}

impl Drop for Errors {
    fn drop(&mut self) {
        if !self.checked && !std::thread::panicking() {
            panic!("distlock-macros: errors dropped without being checked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_comes_back_combined() {
        let mut errors = Errors::new();
        errors.push(Error::new(Span::call_site(), "first"));
        errors.push(Error::new(Span::call_site(), "second"));
        let combined = errors.check(Some(())).unwrap_err();
        assert_eq!(combined.into_iter().count(), 2);
        assert!(Errors::new().check(Some(7)).is_ok());
        let nothing: Result<(), _> = Errors::new().check(None);
        assert!(nothing.unwrap_err().to_string().contains("please report"));
    }

    #[test]
    #[should_panic(expected = "without being checked")]
    fn an_unchecked_collector_panics() {
        let mut errors = Errors::new();
        errors.push(Error::new(Span::call_site(), "lost"));
    }
}
