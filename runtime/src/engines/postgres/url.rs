//! A PostgreSQL deployment, as a builder holds it: the connect options of a `postgres://` URL, or
//! those of the application's own pool (`Backend::postgres`).

use crate::error::LockError;
use crate::util::redact::redact_url;
use sqlx::postgres::PgConnectOptions;
use std::str::FromStr;

/// Where the database is.
#[derive(Debug, Clone)]
pub(crate) struct PgSpec {
    pub(crate) options: PgConnectOptions,
}

impl PgSpec {
    /// Parses `postgres://` or `postgresql://` URLs, as libpq and sqlx read them.
    pub(crate) fn parse(url: &str) -> Result<PgSpec, LockError> {
        match PgConnectOptions::from_str(url) {
            Ok(options) => Ok(PgSpec { options }),
            Err(err) => Err(LockError::invalid_config(
                "url",
                format!(
                    "`{}` is not a PostgreSQL URL ({err}); expected \
                     postgres://[user[:password]@]host[:port]/database[?param=value…]",
                    redact_url(url)
                ),
            )),
        }
    }

    /// `postgres://user@host:port/database`, without a password: for messages.
    pub(crate) fn describe(&self) -> String {
        let options = &self.options;
        format!(
            "postgres://{}@{}:{}/{}",
            options.get_username(),
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or(options.get_username())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_read_as_libpq_reads_it_and_shown_without_its_password() {
        let spec = PgSpec::parse("postgres://app:hunter2@db.internal:5433/orders").unwrap();
        assert_eq!(spec.describe(), "postgres://app@db.internal:5433/orders");
        let bad = PgSpec::parse("postgres://app:hunter2@db:port/x")
            .unwrap_err()
            .to_string();
        assert!(bad.contains("is not a PostgreSQL URL"), "{bad}");
        assert!(!bad.contains("hunter2"), "{bad}");
    }
}
