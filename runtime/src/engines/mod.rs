//! The lock engines, each a directory that registers its deployments: the in-process map
//! (`in_process/`), Redis — one server, Sentinel, Cluster and Redlock (`redis/`) — etcd
//! (`etcd/`, feature `etcd`), PostgreSQL (`postgres/`, feature `postgres`), MySQL (`mysql/`,
//! feature `mysql`) and ZooKeeper (`zookeeper/`, feature `zookeeper`), the last four stores of
//! the queue engine (`queue/`), the databases sharing `sql/`. `engine.rs` is the boundary every engine implements, `spec.rs` what
//! a deployment tells the builder, `settings.rs` what an engine is made with.
//!
//! [`DEPLOYMENTS`] is the one list of URL schemes: [`from_url`] reads a URL with it, and the
//! error for a URL nobody takes lists every form from it.

pub(crate) mod engine;
pub(crate) mod etcd;
pub(crate) mod in_process;
pub(crate) mod mysql;
pub(crate) mod postgres;
pub(crate) mod zookeeper;
// The test hooks build it without a store too: the model checker runs its `order` (tests/model).
#[cfg(any(
    feature = "etcd",
    feature = "postgres",
    feature = "mysql",
    feature = "zookeeper",
    distlock_test_hooks
))]
pub(crate) mod queue;
pub(crate) mod redis;
pub(crate) mod settings;
pub(crate) mod spec;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod sql;

use crate::error::LockError;
use crate::util::hosts::scheme_of;
use crate::util::redact::redact_url;
use spec::{EngineSpec, Parser, Registration};
use std::sync::Arc;

/// Every deployment a URL can name, in the order the error for an unknown URL lists them.
const DEPLOYMENTS: [&Registration; 8] = [
    &redis::deployments::SERVER,
    &redis::deployments::SENTINEL,
    &redis::deployments::CLUSTER,
    &etcd::REGISTRATION,
    &postgres::REGISTRATION,
    &mysql::REGISTRATION,
    &zookeeper::REGISTRATION,
    &in_process::REGISTRATION,
];

/// The deployment `url` names: one URL, or a comma-separated list of URLs where the first one's
/// deployment takes lists (Redis servers: Redlock over them).
///
/// # Errors
/// [`LockError::InvalidConfig`] for `url`: a scheme no deployment takes, a URL its deployment
/// refuses, or an engine this build lacks (naming the feature to turn on).
pub(crate) fn from_url(url: &str) -> Result<Arc<dyn EngineSpec>, LockError> {
    let urls = split_list(url);
    let scheme = scheme_of(&urls[0]);
    let Some(registration) = DEPLOYMENTS
        .iter()
        .find(|deployment| scheme.is_some_and(|scheme| deployment.schemes.contains(&scheme)))
    else {
        return Err(unknown(url));
    };
    if let (Some((parse_list, _)), true) = (registration.list, urls.len() > 1) {
        return parse_list(urls);
    }
    match registration.parser {
        Parser::Url(parse) => parse(url.trim()),
        Parser::Missing { feature, what } => Err(LockError::invalid_config(
            "url",
            format!(
                "`{}` is {what}, and this build of distlock has no engine for it; turn on \
                 distlock's `{feature}` feature",
                redact_url(url)
            ),
        )),
    }
}

/// `url` names no deployment: the error lists every form that does.
fn unknown(url: &str) -> LockError {
    let forms = DEPLOYMENTS.iter().map(|deployment| deployment.forms);
    let lists = DEPLOYMENTS
        .iter()
        .filter_map(|deployment| deployment.list.map(|(_, form)| format!("or {form}")));
    let expected: Vec<String> = forms.map(str::to_owned).chain(lists).collect();
    LockError::invalid_config(
        "url",
        format!(
            "`{}` is not a lock backend URL; expected {}",
            redact_url(url),
            expected.join(", ")
        ),
    )
}

/// The URLs of a comma-separated list (one URL: itself). A comma splits only where a URL of a
/// registered scheme starts, so a percent-encoded or plain comma inside a password stays put.
fn split_list(url: &str) -> Vec<String> {
    let starts: Vec<String> = DEPLOYMENTS
        .iter()
        .flat_map(|deployment| deployment.schemes)
        .map(|scheme| format!(",{scheme}://"))
        .collect();
    let mut urls = Vec::new();
    let mut rest = url.trim();
    loop {
        match starts.iter().filter_map(|start| rest.find(start)).min() {
            Some(at) => {
                urls.push(rest[..at].trim().trim_end_matches(',').to_owned());
                rest = rest[at + 1..].trim_start();
            }
            None => {
                urls.push(rest.trim().trim_end_matches(',').trim().to_owned());
                return urls;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::engine::Deployment;

    fn deployment(url: &str) -> Result<Deployment, String> {
        from_url(url)
            .map(|spec| spec.deployment())
            .map_err(|err| err.to_string())
    }

    #[test]
    fn a_url_names_its_deployment_and_a_list_of_servers_is_redlock() {
        assert_eq!(deployment(" memory:// \n"), Ok(Deployment::InProcess));
        assert_eq!(deployment("redis://a:1"), Ok(Deployment::Redis));
        assert_eq!(
            deployment("redis://a:1,rediss://b:2,redis://c:3"),
            Ok(Deployment::Redlock)
        );
        let unknown = deployment("mongodb://db/locks").unwrap_err();
        assert!(
            unknown.ends_with(
                "expected redis://host:port, rediss://host:port, unix:///path/to/socket, \
                 redis[s]-sentinel://host:port,…/MASTER_NAME, redis[s]-cluster://host:port,…, \
                 etcd[s]://host:port,…, postgres://user@host:port/database, \
                 mysql://user@host:port/database, zookeeper://host:port,…[/chroot], memory://, or three \
                 or more comma-separated redis:// URLs for Redlock"
            ),
            "{unknown}"
        );
    }

    #[test]
    fn only_a_list_that_starts_with_a_server_is_read_as_redlock() {
        let etcd = deployment("etcd://a:2379,etcd://b:2379").unwrap_err();
        assert!(!etcd.contains("Redlock"), "{etcd}");
        let memory = deployment("memory://,redis://a,redis://b").unwrap_err();
        assert!(memory.contains("something after `memory://`"), "{memory}");
        let mixed = deployment("redis://a:1,memory://,redis://b:2").unwrap_err();
        assert!(mixed.contains("is not a Redis URL"), "{mixed}");
    }
}
