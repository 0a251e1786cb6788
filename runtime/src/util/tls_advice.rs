//! What a failed TLS connection means, in words a user can act on. The cause — what rustls
//! found wrong with the server's certificate, or the alert the server sent — is looked for
//! anywhere in an error's source chain: the Redis and etcd clients wrap it in I/O and transport
//! errors.

use std::error::Error;

/// How a user of one store changes what a failed handshake is about.
pub(crate) struct Hints<'a> {
    /// How to trust the CA that signed the server's certificate.
    pub(crate) ca: &'a str,
    /// How to present a client certificate.
    pub(crate) client: &'a str,
    /// How to connect to a server without TLS.
    pub(crate) plain: &'a str,
    /// Whether the client presented a certificate (a server that wants one may answer its
    /// absence with a generic "bad certificate" alert).
    pub(crate) client_cert: bool,
}

impl Hints<'static> {
    /// The Redis and etcd backends: the builder's TLS settings, and the URL scheme `plain` for a
    /// server without TLS.
    pub(crate) fn builder(plain: &'static str, client_cert: bool) -> Hints<'static> {
        Hints {
            ca: "set `tls_ca_file` on the backend builder (or DISTLOCK_TLS_CA_FILE) to the CA \
                 that signed it",
            client: "set `tls_client_auth_files` on the backend builder (or \
                     DISTLOCK_TLS_CERT_FILE and DISTLOCK_TLS_KEY_FILE)",
            plain,
            client_cert,
        }
    }
}

/// Advice for a TLS handshake that failed, if `err` is one: which of the certificate problems
/// it is (not signed by a trusted CA, expired, for another host, a client certificate missing
/// or refused), or a server that does not speak TLS at all.
pub(crate) fn advice(err: &(dyn Error + 'static), hints: &Hints<'_>) -> Option<String> {
    const PROBLEM: &str = "this is a TLS certificate problem";
    let alert = chain_mentions(err, "alert") && chain_mentions(err, "certificate");
    if chain_mentions(err, "certificaterequired") || (alert && !hints.client_cert) {
        return Some(format!(
            "{PROBLEM}: the server requires a client certificate; {}",
            hints.client
        ));
    }
    if alert {
        return Some(format!(
            "{PROBLEM}: the server rejected the client certificate; it must be signed by a CA \
             the server trusts"
        ));
    }
    if chain_mentions(err, "unknownissuer") || chain_mentions(err, "unknown issuer") {
        return Some(format!(
            "{PROBLEM}: the server's certificate is not signed by a CA the client trusts; {}",
            hints.ca
        ));
    }
    if chain_mentions(err, "expired") || chain_mentions(err, "notvalidyet") {
        return Some(format!(
            "{PROBLEM}: the server's certificate has expired (or is not valid yet); the server \
             needs a current certificate"
        ));
    }
    if chain_mentions(err, "not valid for name") || chain_mentions(err, "notvalidforname") {
        return Some(format!(
            "{PROBLEM}: the server's certificate does not name the host in the URL; connect by \
             a name or address the certificate lists (its subjectAltName)"
        ));
    }
    if chain_mentions(err, "certificate") {
        return Some(format!(
            "{PROBLEM}: the server's certificate was not accepted. It must be signed by a CA the \
             client trusts ({}) and name the host in the URL",
            hints.ca
        ));
    }
    if chain_mentions(err, "tls handshake eof")
        || chain_mentions(err, "does not support tls")
        || chain_mentions(err, "invalidcontenttype")
        || chain_mentions(err, "corrupt message")
    {
        return Some(format!(
            "the server did not answer the TLS handshake: it serves plain connections on this \
             port, it seems; {}",
            hints.plain
        ));
    }
    None
}

/// Whether `needle` (lower case) appears in the error or any of its sources.
pub(crate) fn chain_mentions(err: &(dyn Error + 'static), needle: &str) -> bool {
    let mut next = Some(err);
    while let Some(err) = next {
        if err.to_string().to_ascii_lowercase().contains(needle) {
            return true;
        }
        next = err.source();
    }
    false
}
