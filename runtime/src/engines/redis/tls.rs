//! TLS for `rediss://` URLs: which CA to trust and, for servers that check clients
//! (`tls-auth-clients yes`), the client's own certificate. Without a CA the platform's web PKI
//! roots are trusted.

use crate::engines::settings::TlsFiles;
use crate::error::LockError;
use crate::util::redact::redact_url;

/// A redis-rs client for `url`, with `tls` applied to `rediss://` URLs.
pub(crate) fn client(url: &str, tls: &TlsFiles) -> Result<redis::Client, LockError> {
    let secure = url.starts_with("rediss://");
    if secure && !cfg!(feature = "tls") {
        return Err(LockError::invalid_config(
            "url",
            format!(
                "`{}` asks for TLS; enable the `tls` feature of distlock to use rediss:// URLs",
                redact_url(url)
            ),
        ));
    }
    if !secure && tls.is_set() {
        return Err(LockError::invalid_config(
            "tls",
            format!(
                "certificates are configured but `{}` is not a rediss:// URL; use rediss:// to \
                 connect with TLS, or drop the TLS settings",
                redact_url(url)
            ),
        ));
    }
    let invalid = |err: redis::RedisError| {
        LockError::invalid_config(
            "url",
            format!(
                "`{}` is not a valid Redis URL ({}); expected redis://[user:password@]host[:port][/db]",
                redact_url(url),
                err.detail().unwrap_or("malformed"),
            ),
        )
    };
    if !secure {
        return redis::Client::open(url).map_err(invalid);
    }
    secure_client(url, tls, invalid)
}

#[cfg(feature = "tls")]
fn secure_client(
    url: &str,
    tls: &TlsFiles,
    invalid: impl Fn(redis::RedisError) -> LockError,
) -> Result<redis::Client, LockError> {
    // rustls needs a process-wide crypto provider; install ring's unless the application
    // installed one (then that one is used).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let plain = redis::Client::open(url).map_err(invalid)?;
    if !tls.is_set() {
        return Ok(plain);
    }
    let certificates = redis::TlsCertificates {
        client_tls: tls
            .client
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.ca.clone(),
    };
    // The URL parsed above, so what fails here is the certificates.
    redis::Client::build_with_tls(url, certificates).map_err(|err| {
        LockError::invalid_config("tls", format!("certificates are unusable: {err}"))
    })
}

#[cfg(not(feature = "tls"))]
fn secure_client(
    _url: &str,
    _tls: &TlsFiles,
    _invalid: impl Fn(redis::RedisError) -> LockError,
) -> Result<redis::Client, LockError> {
    unreachable!("rediss:// URLs are refused above without the `tls` feature")
}
