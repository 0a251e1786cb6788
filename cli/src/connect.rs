//! The backend the flags name.

use crate::{Cli, Failure};
use distlock::Backend;

/// The backend `--url`/`DISTLOCK_URL` names, with the prefix and TLS files.
pub(crate) fn backend(cli: &Cli) -> Result<Backend, Failure> {
    let Some(url) = cli.url.as_deref() else {
        return Err(Failure::Usage(
            "no lock backend: pass --url redis://host:port (or set DISTLOCK_URL) — the URL your \
             services use"
                .into(),
        ));
    };
    if url.trim_start().starts_with("memory:") {
        return Err(Failure::Usage(
            "memory:// is the in-process backend: its locks live inside one program, where \
             no other process can see them. Point --url at the Redis your services use"
                .into(),
        ));
    }
    let mut builder = Backend::builder(url)
        .prefix(cli.prefix.as_str())
        .holder_label(format!("distlock-cli:{}", std::process::id()));
    if let Some(schema) = &cli.schema {
        builder = builder.schema(schema.as_str());
    }
    if let Some(ca) = &cli.tls_ca_file {
        builder = builder.tls_ca_file(ca);
    }
    if let (Some(cert), Some(key)) = (&cli.tls_cert_file, &cli.tls_key_file) {
        builder = builder.tls_client_auth_files(cert, key);
    }
    Ok(builder.build()?)
}

/// The URL without its password, for messages.
pub(crate) fn describe(url: &Option<String>) -> String {
    let Some(url) = url else {
        return String::new();
    };
    url.split(',')
        .map(|one| match (one.find("://"), one.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                format!("{}***{}", &one[..scheme + 3], &one[at..])
            }
            _ => one.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}
