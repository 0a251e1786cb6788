//! A deployment, as a builder holds it: where its servers are, which of the optional settings it
//! takes, and how its engine is opened. Each deployment implements [`EngineSpec`] in its own
//! directory and registers its URL schemes there ([`Registration`]); `engines/mod.rs` lists the
//! registrations, and nothing else names a deployment.

use super::engine::{Deployment, Engine};
use super::settings::EngineSettings;
use crate::error::LockError;
use std::fmt;
use std::sync::Arc;

/// A deployment, parsed from a URL or built by a typed constructor (`Backend::etcd`, …).
pub(crate) trait EngineSpec: fmt::Debug + Send + Sync + 'static {
    /// What [`Backend::deployment`](crate::Backend::deployment) answers.
    fn deployment(&self) -> Deployment;

    /// Where it is, without passwords: for `Debug` and messages.
    fn describe(&self) -> String;

    /// Why `setting`, which the user set, does not apply here (the end of a sentence that
    /// names it and its value: "for …; do this instead"); `None` when it does.
    fn refuses(&self, setting: Optional) -> Option<String>;

    /// Makes the engine; connections open lazily, on first use.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for what only the deployment can check (a URL its client
    /// refuses, a setting out of its range).
    fn open(&self, settings: &EngineSettings<'_>) -> Result<Arc<dyn Engine>, LockError>;
}

/// The settings only some deployments take: each says which it refuses, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Optional {
    /// TLS files (`tls_ca_file`, `tls_client_auth_files`, …).
    Tls,
    /// Replica acknowledgement (`min_replicas`).
    MinReplicas,
    /// Redlock's per-master timeout (`master_timeout`).
    MasterTimeout,
    /// A database's schema (`schema`, `create_schema`).
    Schema,
    /// Exclusive locks without fencing tokens (`fencing_tokens(false)`): efficiency locks.
    Unfenced,
}

/// Why efficiency locks do not apply to `spec`, whose tokens are `how`: a lock costs the same
/// with or without one.
#[cfg_attr(
    not(any(
        feature = "etcd",
        feature = "zookeeper",
        feature = "postgres",
        feature = "mysql"
    )),
    allow(dead_code)
)]
pub(crate) fn tokens_are_free(spec: &dyn EngineSpec, how: &str) -> String {
    format!(
        "`{}`, whose fencing tokens are {how} and cost no server work of their own;          fencing_tokens(false) saves the token's work on one Redis, Sentinel or Cluster. Drop it",
        spec.describe()
    )
}

/// Why `master_timeout` does not apply to `spec`, which is not Redlock.
pub(crate) fn only_redlock(spec: &dyn EngineSpec) -> String {
    format!(
        "`{}` is one deployment, not Redlock; it applies to Redlock, over three or more \
         comma-separated master URLs",
        spec.describe()
    )
}

/// Why a schema does not apply to `spec`, which is not a database.
pub(crate) fn not_a_database(spec: &dyn EngineSpec) -> String {
    format!(
        "`{}`, which is not a database; a schema names where a database keeps the lock tables \
         (postgres://, mysql://)",
        spec.describe()
    )
}

/// Parses one URL into a deployment.
pub(crate) type ParseUrl = fn(&str) -> Result<Arc<dyn EngineSpec>, LockError>;

/// Parses a comma-separated list of URLs into a deployment.
pub(crate) type ParseList = fn(Vec<String>) -> Result<Arc<dyn EngineSpec>, LockError>;

/// How a deployment is named in a URL: its schemes, and the parser that reads them.
pub(crate) struct Registration {
    /// The URL schemes it answers to (`redis`, `rediss`, …), without `://`.
    pub(crate) schemes: &'static [&'static str],
    /// The forms it accepts, for the error that lists every accepted URL.
    pub(crate) forms: &'static str,
    pub(crate) parser: Parser,
    /// A comma-separated list of URLs that starts with one of this deployment's, and what the
    /// error that lists every accepted URL says of it: another deployment made of several of
    /// these (Redlock over Redis servers).
    pub(crate) list: Option<(ParseList, &'static str)>,
}

impl Registration {
    /// A deployment read from one URL of one of `schemes`, built into every build.
    pub(crate) const fn url(
        schemes: &'static [&'static str],
        forms: &'static str,
        parse: ParseUrl,
    ) -> Registration {
        Registration {
            schemes,
            forms,
            parser: Parser::Url(parse),
            list: None,
        }
    }
}

/// What reads a deployment's URL in this build.
pub(crate) enum Parser {
    /// This parser.
    Url(ParseUrl),
    /// Nothing: the engine needs this Cargo feature, which the build lacks; its URLs name
    /// `what` ("an etcd cluster").
    #[allow(
        dead_code,
        reason = "made only by builds that lack an engine's feature (a build with every one \
                  never does)"
    )]
    Missing {
        feature: &'static str,
        what: &'static str,
    },
}
