//! The lock engines, each a directory that registers its deployments: the in-process map
//! (`in_process/`), Redis — one server, Sentinel, Cluster and Redlock (`redis/`) — and etcd
//! (`etcd/`, feature `etcd`). `engine.rs` is the boundary every engine implements, `spec.rs` what
//! a deployment tells the builder, `settings.rs` what an engine is made with.
//!
//! [`DEPLOYMENTS`] is the one list of URL schemes: [`from_url`] reads a URL with it, and the
//! error for a URL nobody takes lists every form from it.

pub(crate) mod engine;
pub(crate) mod etcd;
pub(crate) mod in_process;
#[cfg(feature = "etcd")]
pub(crate) mod queue;
pub(crate) mod redis;
pub(crate) mod settings;
pub(crate) mod spec;

use crate::error::LockError;
use crate::util::redact::redact_url;
use spec::{EngineSpec, Registration};
use std::sync::Arc;

/// Every deployment a URL can name, in the order the error for an unknown URL lists them.
const DEPLOYMENTS: [&Registration; 6] = [
    &redis::deployments::SERVER,
    &redis::deployments::SENTINEL,
    &redis::deployments::CLUSTER,
    &etcd::REGISTRATION,
    &in_process::REGISTRATION,
    &redis::deployments::REDLOCK,
];

/// The deployment `url` names: one URL, or a comma-separated list of them (Redlock's masters).
///
/// # Errors
/// [`LockError::InvalidConfig`] for `url`: a scheme no deployment takes, a URL its deployment
/// refuses, or an engine this build lacks (naming the feature to turn on).
pub(crate) fn from_url(url: &str) -> Result<Arc<dyn EngineSpec>, LockError> {
    let urls = split_list(url);
    if urls.len() > 1 {
        let list = DEPLOYMENTS.iter().find_map(|deployment| deployment.list);
        return list.expect("a deployment takes lists")(urls);
    }
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    let registration = DEPLOYMENTS
        .iter()
        .find(|deployment| scheme.is_some_and(|scheme| deployment.schemes.contains(&scheme)));
    let Some(registration) = registration else {
        let forms: Vec<&str> = DEPLOYMENTS
            .iter()
            .map(|deployment| deployment.forms)
            .collect();
        return Err(LockError::invalid_config(
            "url",
            format!(
                "`{}` is not a lock backend URL; expected {}",
                redact_url(url),
                forms.join(", ")
            ),
        ));
    };
    match (registration.parse, registration.feature) {
        (Some(parse), _) => parse(url),
        (None, Some((feature, what))) => Err(LockError::invalid_config(
            "url",
            format!(
                "`{}` is {what}, and this build of distlock has no engine for it; turn on \
                 distlock's `{feature}` feature",
                redact_url(url)
            ),
        )),
        (None, None) => unreachable!("a deployment built into every build has a parser"),
    }
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
