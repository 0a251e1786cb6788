//! A MySQL deployment, as a builder holds it: the connect options of a `mysql://` URL, or those
//! of the application's own pool (`Backend::mysql`).

use crate::error::LockError;
use crate::util::redact::redact_url;
use sqlx::mysql::MySqlConnectOptions;
use std::str::FromStr;

/// Where the database is.
#[derive(Debug, Clone)]
pub(crate) struct MySqlSpec {
    pub(crate) options: MySqlConnectOptions,
}

impl MySqlSpec {
    /// Parses `mysql://` (or `mariadb://`) URLs, as sqlx reads them: `ssl-mode`, `ssl-ca`,
    /// `ssl-cert` and `ssl-key` among the parameters.
    pub(crate) fn parse(url: &str) -> Result<MySqlSpec, LockError> {
        let as_mysql = match url.trim().strip_prefix("mariadb://") {
            Some(rest) => format!("mysql://{rest}"),
            None => url.trim().to_owned(),
        };
        match MySqlConnectOptions::from_str(&as_mysql) {
            Ok(options) => Ok(MySqlSpec { options }),
            Err(err) => Err(LockError::invalid_config(
                "url",
                format!(
                    "`{}` is not a MySQL URL ({err}); expected \
                     mysql://[user[:password]@]host[:port]/database[?param=value…]",
                    redact_url(url)
                ),
            )),
        }
    }

    /// `mysql://user@host:port/database`, without a password: for messages.
    pub(crate) fn describe(&self) -> String {
        let options = &self.options;
        format!(
            "mysql://{}@{}:{}/{}",
            options.get_username(),
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or("")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_read_as_sqlx_reads_it_and_shown_without_its_password() {
        let spec = MySqlSpec::parse("mysql://app:hunter2@db.internal:3307/orders").unwrap();
        assert_eq!(spec.describe(), "mysql://app@db.internal:3307/orders");
        let maria = MySqlSpec::parse("mariadb://app@db/orders").unwrap();
        assert_eq!(maria.describe(), "mysql://app@db:3306/orders");
        let bad = MySqlSpec::parse("mysql://app:hunter2@db:port/x")
            .unwrap_err()
            .to_string();
        assert!(bad.contains("is not a MySQL URL"), "{bad}");
        assert!(!bad.contains("hunter2"), "{bad}");
    }
}
