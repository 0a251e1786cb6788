//! Attributes written by a `macro_rules!` macro: literals passed in as `$value:literal` or
//! `$value:expr` fragments reach the attribute wrapped in invisible groups, and are accepted as
//! the literals they are; placeholders in a template from the macro's caller name the
//! parameters (and the receiver) the macro declares. Runs on the in-process backend.
#![deny(warnings)]

use distlock::{distributed_lock, LockError};

macro_rules! locked_counter {
    ($name:ident, $template:literal, $backend:expr) => {
        #[distributed_lock(key = $template, wait = "1s", backend = $backend)]
        pub async fn $name(id: u32) -> Result<u32, LockError> {
            Ok(id)
        }
    };
}

locked_counter!(first, "first:<id>", "macro-made");
locked_counter!(second, "second:<id>", "macro-made");

pub struct Job {
    pub id: u64,
}

macro_rules! locked_method {
    ($template:literal) => {
        impl Job {
            #[distributed_lock(key = $template, backend = "macro-made")]
            pub async fn run(&self, step: u32) -> Result<u64, LockError> {
                Ok(self.id + u64::from(step))
            }
        }
    };
}

locked_method!("job:<self.id>:<step>");

#[path = "../support/in_process.rs"]
mod in_process;

fn main() {
    in_process::run("macro-made", |backend| async move {
        assert_eq!(first(1).await.unwrap(), 1);
        assert_eq!(second(2).await.unwrap(), 2);
        assert_eq!(Job { id: 7 }.run(3).await.unwrap(), 10);
        assert_eq!(backend.stats().acquired, 3);
    });
}
