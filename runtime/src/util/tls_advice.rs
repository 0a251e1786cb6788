//! What a failed TLS connection means, in words a user can act on. The cause — what rustls
//! found wrong with the server's certificate, or the alert the server sent — is looked for
//! anywhere in an error's source chain: the Redis and etcd clients wrap it in I/O and transport
//! errors.

use std::error::Error;

/// Advice for a TLS handshake that failed, if `err` is one: which of the certificate problems
/// it is (not signed by a trusted CA, expired, for another host, a client certificate missing
/// or refused), or a server that does not speak TLS at all (`plain`: the URL scheme for it).
/// `client_cert`: whether the client presented a certificate (a server that wants one may
/// answer its absence with a generic "bad certificate" alert).
pub(crate) fn advice(
    err: &(dyn Error + 'static),
    plain: &str,
    client_cert: bool,
) -> Option<String> {
    const PROBLEM: &str = "this is a TLS certificate problem";
    let alert = chain_mentions(err, "alert") && chain_mentions(err, "certificate");
    if chain_mentions(err, "certificaterequired") || (alert && !client_cert) {
        return Some(format!(
            "{PROBLEM}: the server requires a client certificate; set `tls_client_auth_files` \
             on the backend builder (or DISTLOCK_TLS_CERT_FILE and DISTLOCK_TLS_KEY_FILE)"
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
            "{PROBLEM}: the server's certificate is not signed by a CA the client trusts; set \
             `tls_ca_file` on the backend builder (or DISTLOCK_TLS_CA_FILE) to the CA that \
             signed it"
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
             client trusts (set `tls_ca_file` on the backend builder, or DISTLOCK_TLS_CA_FILE, to \
             the CA that signed it) and name the host in the URL"
        ));
    }
    if chain_mentions(err, "tls handshake eof")
        || chain_mentions(err, "invalidcontenttype")
        || chain_mentions(err, "corrupt message")
    {
        return Some(format!(
            "the server did not answer the TLS handshake: it serves plain connections on this \
             port, it seems; a server without TLS takes the {plain}:// scheme"
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
