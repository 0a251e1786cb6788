//! Metrics on the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`): what this
//! process's locks do, for dashboards and alerts. Every emission of the crate goes through the
//! small functions and guards here, called where the backend's stats (`stats.rs`) are counted.
//! Without the feature they are empty and inlined and the types hold nothing: no dependency, no
//! code. [The operating chapter](crate::guide::operating) of the guide lists the same metrics for
//! users.
//!
//! | name | type | extra label | meaning |
//! |---|---|---|---|
//! | `distlock_acquisitions_total` | counter | `outcome` | acquisitions that ended: `acquired`, `busy` (the wait budget ran out), `error` (any other failure: the server, replicas, an invalid key or lease) |
//! | `distlock_wait_seconds` | histogram | | time from the call to the lock acquired, for `acquired` outcomes |
//! | `distlock_hold_seconds` | histogram | | time from the lock acquired until its call gave it up (released it, dropped its guard, returned, panicked or was cancelled) |
//! | `distlock_leases_lost_total` | counter | `reason` | leases lost while held, by [`LostReason`](crate::LostReason): `expired`, `gone`, `taken_over`, `max_hold_exceeded`, `shut_down` |
//! | `distlock_renewals_total` | counter | | leases the watchdog renewed (one per key per confirmed renewal) |
//! | `distlock_releases_total` | counter | `outcome` | releases the server answered, by [`Released`](crate::Released): `released`, `expired` (the lock had run out before), `taken_over` (another owner held the key) |
//! | `distlock_leases_held` | gauge | | keys this process's calls hold now |
//! | `distlock_tasks_waiting` | gauge | | tasks waiting now for a lock another task or process holds (queued behind a task of this process, or waiting for a busy lock's release or after a failed attempt) |
//!
//! Every metric carries two labels, both bounded by the code, never by the data:
//! - `backend`: the backend's registry name ([`Backend::name`](crate::Backend::name);
//!   `unregistered` for one used only through [`Lock::on`](crate::Lock::on));
//! - `lock`: the lock's key *template*: `order:<order.id>` as written in the attribute, the
//!   templates of `keys = [..]` joined with `,` in the order written, or
//!   [`Lock::template`](crate::Lock::template) (`untemplated` when not given). Never the
//!   rendered key, so a key per order does not make a time series per order.
//!
//! Units of counting: one acquisition, wait and hold per lock (a `keys = [..]` lock is one);
//! leases, renewals, losses and releases per key. A reentrant call acquires nothing and counts
//! nothing; an acquisition cancelled before it ended counts no outcome, nor does a lock on a
//! backend that is not configured (there is no backend to name). A lease counts as held
//! from the acquire's reply until its call gives it up, and a task as waiting from the moment it
//! could not go ahead until it got the lock or gave up: both gauges are kept by guards that go
//! back down on every exit path (release, drop, panic, cancellation).
//!
//! The values of `reason` and of the releases' `outcome` are the public enums' variants in snake
//! case; the enums name them (`LostReason::label`, `Released::label`), so this module imports
//! neither and stays a leaf of the module graph.
//!
//! Labels are cheap on the hot path: the template is a `&'static str` from the attribute (or
//! shared text), the backend name shared text, so an emission copies no text; it allocates only
//! the label list the facade asks for. Handles are not cached: one taken before the application
//! installs its recorder would record nowhere for good.

pub(crate) use imp::{
    acquisition, lease_lost, released, renewed, Holding, Labels, Template, Waiting,
};

#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use imp::describe_metrics;

#[cfg(feature = "metrics")]
mod imp {
    use crate::error::LockError;
    use ::metrics::{counter, gauge, histogram, Label, SharedString, Unit};
    use std::borrow::Cow;
    use std::future::Future;
    use std::sync::Arc;
    use std::task::Poll;
    use std::time::{Duration, Instant};

    /// The name of each metric, so that the emission and `describe` agree.
    mod names {
        pub(super) const ACQUISITIONS: &str = "distlock_acquisitions_total";
        pub(super) const WAIT: &str = "distlock_wait_seconds";
        pub(super) const HOLD: &str = "distlock_hold_seconds";
        pub(super) const LEASES_LOST: &str = "distlock_leases_lost_total";
        pub(super) const RENEWALS: &str = "distlock_renewals_total";
        pub(super) const RELEASES: &str = "distlock_releases_total";
        pub(super) const LEASES_HELD: &str = "distlock_leases_held";
        pub(super) const TASKS_WAITING: &str = "distlock_tasks_waiting";
    }

    /// A lock's `lock` label: its key template. Cheap to clone (static, or shared).
    #[derive(Debug, Clone)]
    pub(crate) struct Template(SharedString);

    impl Template {
        /// The label of a [`Lock`](crate::Lock) that was given no template.
        pub(crate) const UNTEMPLATED: Template = Template(SharedString::const_str("untemplated"));

        pub(crate) fn new(text: Cow<'static, str>) -> Template {
            Template(match text {
                Cow::Borrowed(text) => SharedString::const_str(text),
                // Shared, so the label's clones on every emission copy no text.
                Cow::Owned(text) => SharedString::from_shared(Arc::from(text)),
            })
        }
    }

    /// The labels of one lock, made once per acquisition and shared by its leases.
    #[derive(Debug, Clone)]
    pub(crate) struct Labels {
        backend: SharedString,
        lock: SharedString,
    }

    impl Labels {
        /// `backend`: the backend's registry name (asked for only with the feature on).
        pub(crate) fn new(backend: impl FnOnce() -> Arc<str>, template: &Template) -> Labels {
            Labels {
                backend: SharedString::from_shared(backend()),
                lock: template.0.clone(),
            }
        }

        fn base(&self) -> Vec<Label> {
            vec![
                Label::new("backend", self.backend.clone()),
                Label::new("lock", self.lock.clone()),
            ]
        }

        fn and(&self, key: &'static str, value: &'static str) -> Vec<Label> {
            let mut labels = self.base();
            labels.push(Label::from_static_parts(key, value));
            labels
        }
    }

    /// An acquisition ended with `result`, after `waited`.
    pub(crate) fn acquisition<T>(labels: &Labels, result: &Result<T, LockError>, waited: Duration) {
        counter!(
            names::ACQUISITIONS,
            labels.and("outcome", acquisition_outcome(result))
        )
        .increment(1);
        if result.is_ok() {
            histogram!(names::WAIT, labels.base()).record(waited);
        }
    }

    fn acquisition_outcome<T>(result: &Result<T, LockError>) -> &'static str {
        match result {
            Ok(_) => "acquired",
            Err(err) if err.is_busy() => "busy",
            Err(_) => "error",
        }
    }

    pub(crate) fn lease_lost(labels: &Labels, reason: &'static str) {
        counter!(names::LEASES_LOST, labels.and("reason", reason)).increment(1);
    }

    pub(crate) fn renewed(labels: &Labels) {
        counter!(names::RENEWALS, labels.base()).increment(1);
    }

    pub(crate) fn released(labels: &Labels, outcome: &'static str) {
        counter!(names::RELEASES, labels.and("outcome", outcome)).increment(1);
    }

    /// The keys one guard holds, in `distlock_leases_held`, and its hold time. Whatever ends
    /// the guard — release, drop, panic, a cancelled acquire — ends this too, at the latest when
    /// it is dropped.
    #[derive(Debug)]
    pub(crate) struct Holding {
        labels: Labels,
        leases: u32,
        /// When the whole lock was acquired and handed to the caller.
        since: Option<Instant>,
    }

    impl Holding {
        pub(crate) fn new(labels: Labels) -> Holding {
            Holding {
                labels,
                leases: 0,
                since: None,
            }
        }

        pub(crate) fn lease_taken(&mut self) {
            self.leases += 1;
            gauge!(names::LEASES_HELD, self.labels.base()).increment(1.0);
        }

        /// Every key is held: the hold time starts.
        pub(crate) fn complete(&mut self) {
            self.since = Some(Instant::now());
        }

        /// The call gave the lock up. Idempotent.
        pub(crate) fn end(&mut self) {
            if self.leases > 0 {
                gauge!(names::LEASES_HELD, self.labels.base()).decrement(f64::from(self.leases));
                self.leases = 0;
            }
            if let Some(since) = self.since.take() {
                histogram!(names::HOLD, self.labels.base()).record(since.elapsed());
            }
        }
    }

    impl Drop for Holding {
        fn drop(&mut self) {
            self.end();
        }
    }

    /// One task's place in `distlock_tasks_waiting` while it acquires one key: counted from
    /// [`start`](Self::start) until dropped (acquired, given up, failed or cancelled).
    #[derive(Debug)]
    pub(crate) struct Waiting<'a> {
        labels: &'a Labels,
        counted: bool,
    }

    impl<'a> Waiting<'a> {
        pub(crate) fn new(labels: &'a Labels) -> Waiting<'a> {
            Waiting {
                labels,
                counted: false,
            }
        }

        /// The task cannot go ahead: it waits from now on. Idempotent.
        pub(crate) fn start(&mut self) {
            if !self.counted {
                self.counted = true;
                gauge!(names::TASKS_WAITING, self.labels.base()).increment(1.0);
            }
        }

        /// Awaits `future`, waiting from the moment it is not ready at once (a task queued
        /// behind another task's turn).
        ///
        /// # Cancel safety
        /// As cancel safe as `future`.
        /// Dropping the future drops `future` (its own cancel safety applies); a task counted as
        /// waiting stays counted until `self` is dropped.
        pub(crate) async fn unless_ready<F: Future>(&mut self, future: F) -> F::Output {
            let mut future = std::pin::pin!(future);
            let first = std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await;
            if let Poll::Ready(output) = first {
                return output;
            }
            self.start();
            future.await
        }
    }

    impl Drop for Waiting<'_> {
        fn drop(&mut self) {
            if self.counted {
                gauge!(names::TASKS_WAITING, self.labels.base()).decrement(1.0);
            }
        }
    }

    /// Gives the installed recorder each distlock metric's type, unit and help text (the
    /// `# HELP` lines of a Prometheus scrape). Call it once, after installing the recorder; the
    /// metrics are recorded whether or not it was called.
    ///
    /// The metrics (`distlock_acquisitions_total`, `distlock_wait_seconds`,
    /// `distlock_hold_seconds`, `distlock_leases_lost_total`, `distlock_renewals_total`,
    /// `distlock_releases_total`, `distlock_leases_held`, `distlock_tasks_waiting`), their labels
    /// and what each counts: [the operating chapter](crate::guide::operating#metrics) of the
    /// guide.
    ///
    /// ```
    /// // With a recorder installed first, e.g. metrics_exporter_prometheus's
    /// // `PrometheusBuilder::new().install_recorder()`:
    /// distlock::describe_metrics();
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn describe_metrics() {
        use ::metrics::{describe_counter, describe_gauge, describe_histogram};
        describe_counter!(
            names::ACQUISITIONS,
            Unit::Count,
            "Lock acquisitions that ended, by outcome: acquired, busy (the wait budget ran out), error"
        );
        describe_histogram!(
            names::WAIT,
            Unit::Seconds,
            "Time from the call to the lock acquired"
        );
        describe_histogram!(
            names::HOLD,
            Unit::Seconds,
            "Time from the lock acquired until its call gave it up"
        );
        describe_counter!(
            names::LEASES_LOST,
            Unit::Count,
            "Leases lost while held, by reason: expired, gone, taken_over, max_hold_exceeded, shut_down"
        );
        describe_counter!(
            names::RENEWALS,
            Unit::Count,
            "Leases the watchdog renewed, one per key per confirmed renewal"
        );
        describe_counter!(
            names::RELEASES,
            Unit::Count,
            "Releases the server answered, by outcome: released, expired, taken_over"
        );
        describe_gauge!(
            names::LEASES_HELD,
            Unit::Count,
            "Keys this process's calls hold now"
        );
        describe_gauge!(
            names::TASKS_WAITING,
            Unit::Count,
            "Tasks waiting now for a lock that another task or process holds"
        );
    }
}

/// The same surface, doing nothing.
#[cfg(not(feature = "metrics"))]
mod imp {
    use crate::error::LockError;
    use std::borrow::Cow;
    use std::future::Future;
    use std::sync::Arc;
    use std::time::Duration;

    #[derive(Debug, Clone)]
    pub(crate) struct Template;

    impl Template {
        pub(crate) const UNTEMPLATED: Template = Template;

        #[inline]
        pub(crate) fn new(_text: Cow<'static, str>) -> Template {
            Template
        }
    }

    #[derive(Debug, Clone)]
    pub(crate) struct Labels;

    impl Labels {
        #[inline]
        pub(crate) fn new(_backend: impl FnOnce() -> Arc<str>, _template: &Template) -> Labels {
            Labels
        }
    }

    #[inline]
    pub(crate) fn acquisition<T>(_: &Labels, _: &Result<T, LockError>, _: Duration) {}

    #[inline]
    pub(crate) fn lease_lost(_: &Labels, _: &'static str) {}

    #[inline]
    pub(crate) fn renewed(_: &Labels) {}

    #[inline]
    pub(crate) fn released(_: &Labels, _: &'static str) {}

    #[derive(Debug)]
    pub(crate) struct Holding;

    impl Holding {
        #[inline]
        pub(crate) fn new(_: Labels) -> Holding {
            Holding
        }

        #[inline]
        pub(crate) fn lease_taken(&mut self) {}

        #[inline]
        pub(crate) fn complete(&mut self) {}

        #[inline]
        pub(crate) fn end(&mut self) {}
    }

    #[derive(Debug)]
    pub(crate) struct Waiting<'a>(std::marker::PhantomData<&'a Labels>);

    impl<'a> Waiting<'a> {
        #[inline]
        pub(crate) fn new(_: &'a Labels) -> Waiting<'a> {
            Waiting(std::marker::PhantomData)
        }

        #[inline]
        pub(crate) fn start(&mut self) {}

        /// Awaits `future`.
        ///
        /// # Cancel safety
        /// As cancel safe as `future`.
        /// Dropping the future drops `future`; its own cancel safety applies.
        #[inline]
        pub(crate) async fn unless_ready<F: Future>(&mut self, future: F) -> F::Output {
            future.await
        }
    }
}
