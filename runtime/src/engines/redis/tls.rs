//! TLS for `rediss://`, `rediss-sentinel://` and `rediss-cluster://` URLs: which CA to trust
//! and, for servers that check clients (`tls-auth-clients yes`), the client's own certificate.
//! Without a CA the web PKI roots are trusted.

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
    // The URL parsed above, so what fails here is the certificates.
    redis::Client::build_with_tls(url, certificates(tls)).map_err(|err| {
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

/// `host:port`, over TLS when `secure`.
pub(crate) fn address(host: String, port: u16, secure: bool) -> redis::ConnectionAddr {
    match secure {
        true => redis::ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            tls_params: None,
        },
        false => redis::ConnectionAddr::Tcp(host, port),
    }
}

/// A redis-rs client for `info`, with `tls`'s certificates when its address is TLS and some
/// are set (else the web PKI roots, and no client certificate).
pub(crate) fn client_for(
    info: redis::ConnectionInfo,
    tls: &TlsFiles,
) -> redis::RedisResult<redis::Client> {
    let secure = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
    match secure && tls.is_set() {
        true => with_certificates(info, tls),
        false => redis::Client::open(info),
    }
}

/// A Sentinel client builder that speaks TLS to the sentinels and to the servers they name,
/// with `tls`'s certificates if some are set.
#[cfg(feature = "tls")]
pub(crate) fn secure_sentinels(
    builder: redis::sentinel::SentinelClientBuilder,
    tls: &TlsFiles,
) -> redis::sentinel::SentinelClientBuilder {
    let builder = builder
        .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure)
        .set_client_to_redis_tls_mode(redis::TlsMode::Secure);
    match tls.is_set() {
        true => builder
            .set_client_to_sentinel_certificates(certificates(tls))
            .set_client_to_redis_certificates(certificates(tls)),
        false => builder,
    }
}

#[cfg(not(feature = "tls"))]
pub(crate) fn secure_sentinels(
    _builder: redis::sentinel::SentinelClientBuilder,
    _tls: &TlsFiles,
) -> redis::sentinel::SentinelClientBuilder {
    unreachable!("rediss-sentinel:// URLs are refused when parsed, without the `tls` feature")
}

/// A cluster client builder that speaks TLS to every node (the seeds, and the nodes learnt
/// from the slot map and redirections), with `tls`'s certificates if some are set.
#[cfg(feature = "tls")]
pub(crate) fn secure_cluster(
    builder: redis::cluster::ClusterClientBuilder,
    tls: &TlsFiles,
) -> redis::cluster::ClusterClientBuilder {
    let builder = builder.tls(redis::TlsMode::Secure);
    match tls.is_set() {
        true => builder.certs(certificates(tls)),
        false => builder,
    }
}

#[cfg(not(feature = "tls"))]
pub(crate) fn secure_cluster(
    _builder: redis::cluster::ClusterClientBuilder,
    _tls: &TlsFiles,
) -> redis::cluster::ClusterClientBuilder {
    unreachable!("rediss-cluster:// URLs are refused when parsed, without the `tls` feature")
}

#[cfg(feature = "tls")]
fn with_certificates(
    info: redis::ConnectionInfo,
    tls: &TlsFiles,
) -> redis::RedisResult<redis::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    redis::Client::build_with_tls(info, certificates(tls))
}

#[cfg(not(feature = "tls"))]
fn with_certificates(
    _info: redis::ConnectionInfo,
    _tls: &TlsFiles,
) -> redis::RedisResult<redis::Client> {
    unreachable!("TLS addresses come only from URLs refused without the `tls` feature")
}

/// `tls` as redis-rs takes it.
#[cfg(feature = "tls")]
fn certificates(tls: &TlsFiles) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: tls
            .client
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.ca.clone(),
    }
}
