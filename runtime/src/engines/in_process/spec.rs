//! The in-process deployment: `memory://`, [`Backend::in_process`](crate::Backend::in_process).

use super::InProcessEngine;
use crate::engines::engine::{Deployment, Engine};
use crate::engines::settings::EngineSettings;
use crate::engines::spec::{not_a_database, only_redlock, EngineSpec, Optional, Registration};
use crate::error::LockError;
#[cfg(distlock_test_hooks)]
use crate::hooks::Probe;
use crate::util::redact::redact_url;
use std::sync::Arc;

/// `memory://`, and nothing after it.
pub(crate) const REGISTRATION: Registration = Registration::url(&["memory"], "memory://", parse);

/// The in-process map: one per backend, nothing to say where.
#[derive(Debug)]
pub(crate) struct InProcessSpec;

fn parse(url: &str) -> Result<Arc<dyn EngineSpec>, LockError> {
    match url.trim_end_matches('/') {
        "memory:" => Ok(Arc::new(InProcessSpec)),
        _ => Err(LockError::invalid_config(
            "url",
            format!(
                "`{}` has something after `memory://`, which names nothing else; the in-process \
                 backend is `memory://`",
                redact_url(url)
            ),
        )),
    }
}

impl EngineSpec for InProcessSpec {
    fn deployment(&self) -> Deployment {
        Deployment::InProcess
    }

    fn describe(&self) -> String {
        "memory://".into()
    }

    fn refuses(&self, setting: Optional) -> Option<String> {
        Some(match setting {
            Optional::Tls => "the in-process backend (memory://), which has no connection to \
                              secure; drop the TLS settings"
                .into(),
            Optional::MinReplicas => {
                "the in-process backend (memory://), which has no replicas; set it to 0".into()
            }
            Optional::MasterTimeout => only_redlock(self),
            Optional::Schema => not_a_database(self),
            Optional::Unfenced => return None,
        })
    }

    fn open(&self, settings: &EngineSettings<'_>) -> Result<Arc<dyn Engine>, LockError> {
        let engine = Arc::new(InProcessEngine::new(
            settings.prefix,
            settings.marker_ttl,
            settings.holder_label,
            settings.fenced,
        ));
        #[cfg(distlock_test_hooks)]
        settings.hooks.show(
            Probe::WatchedChannels,
            &engine,
            InProcessEngine::watched_channels,
        );
        Ok(engine)
    }
}
