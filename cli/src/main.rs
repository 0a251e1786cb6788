//! `distlock`: what an operator asks of the locks in production — who holds this lock, for how
//! long, is it stuck — without `TTL`, `TYPE` and `CLIENT LIST` by hand.
//!
//! ```text
//! distlock inspect order:17            # holder label, fencing token, TTL left, waiters
//! distlock list --pattern 'order:*'    # every held lock under the prefix (SCAN), soonest TTL first
//! distlock doctor                      # server settings that weaken locks, each with what to do
//! distlock unlock order:17 --force     # break a stuck lock (fences its holder out)
//! distlock watch order:17              # acquire/renew/release/expiry events, live
//! distlock schema postgres             # the SQL of the lock tables, for a migration
//! distlock acl etcd --user locker       # the rights a lock user needs, and nothing more
//! ```
//!
//! Every command takes `--url` (default `DISTLOCK_URL`), `--prefix` (default `DISTLOCK_PREFIX`,
//! else `distlock`), `--schema` (PostgreSQL; default `DISTLOCK_SCHEMA`, else `distlock`) and
//! `--json`: one JSON object per line (NDJSON) on standard output, for every
//! command — a lock, a finding, an event per line — and errors as
//! `{"error": {"kind": …, "message": …}}` on standard error. Exit codes: 0 held / done / healthy,
//! 1 free / nothing removed / findings, 2 usage, 3 the backend failed (for `watch`: its stream
//! failed). `distlock completions bash|zsh|fish|elvish|powershell` prints a completion script.

mod connect;
mod render;

use clap::{Parser, Subcommand};
use distlock::{LockError, Notifications};
use render::Format;
use std::process::ExitCode;

/// Inspect, list, break and follow distlock locks; check the lock server.
#[derive(Parser, Debug)]
#[command(name = "distlock", version)]
struct Cli {
    /// The lock backend: redis://, rediss://, unix://, redis[s]-sentinel://,
    /// redis[s]-cluster://, etcd[s]://, postgres://, mysql:// or zookeeper:// (each built with
    /// the feature of its name), or three or more comma-separated redis:// URLs (Redlock) — the
    /// URL your services use.
    #[arg(long, env = "DISTLOCK_URL", global = true, hide_env_values = true)]
    url: Option<String>,
    /// The key prefix your services use.
    #[arg(
        long,
        env = "DISTLOCK_PREFIX",
        default_value = "distlock",
        global = true
    )]
    prefix: String,
    /// The PostgreSQL schema of the lock tables your services use.
    #[arg(long, env = "DISTLOCK_SCHEMA", global = true)]
    schema: Option<String>,
    /// CA certificate(s) to trust for TLS URLs: rediss://, rediss-sentinel://,
    /// rediss-cluster://, etcds:// (PEM).
    #[arg(long, env = "DISTLOCK_TLS_CA_FILE", global = true)]
    tls_ca_file: Option<std::path::PathBuf>,
    /// Client certificate for TLS servers that verify clients (PEM; needs --tls-key-file).
    #[arg(
        long,
        env = "DISTLOCK_TLS_CERT_FILE",
        global = true,
        requires = "tls_key_file"
    )]
    tls_cert_file: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(
        long,
        env = "DISTLOCK_TLS_KEY_FILE",
        global = true,
        requires = "tls_cert_file"
    )]
    tls_key_file: Option<std::path::PathBuf>,
    /// Print JSON instead of text: one object per line (NDJSON) for every command; errors as
    /// {"error": {"kind": …, "message": …}} on standard error.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Who holds each lock: holder label, fencing token, TTL left, waiters. Exit 0 when every
    /// lock is held, 1 when one is free.
    Inspect {
        /// Lock keys as your code names them (`order:17`), without the prefix.
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Every held lock under the prefix whose key matches the pattern, soonest to expire first
    /// (SCAN, never KEYS). Exit 0 when one is held, 1 when none is.
    List {
        /// A Redis glob on the key: `*`, `?`, `[a-z]`, `\` escapes.
        #[arg(long, default_value = "*")]
        pattern: String,
    },
    /// The lock server's settings that weaken locks, each with what to do. Exit 0 when there
    /// is nothing to fix, 1 when there is. Needs a user that may run CONFIG GET, INFO,
    /// ACL WHOAMI and ACL DRYRUN (an operator's, not the lock user's: a setting it may not
    /// read is reported as "unchecked", never as healthy).
    Doctor,
    /// Remove a lock whoever holds it. The next fencing token is larger than the removed
    /// holder's, and its watchdog reports the lease lost. Exit 0 removed, 1 it was free.
    Unlock {
        /// The lock key, without the prefix.
        key: String,
        /// Required: breaking a lock stops nothing its holder is doing.
        #[arg(long)]
        force: bool,
    },
    /// Follow a lock live (acquired, renewed, released, expired, evicted) until interrupted.
    /// Needs keyspace notifications on the server.
    Watch {
        /// The lock key, without the prefix.
        key: String,
        /// Turn on the keyspace notifications it needs (`CONFIG SET notify-keyspace-events`)
        /// where they are off, instead of failing.
        #[arg(long)]
        enable_notifications: bool,
        /// Stop after this many events.
        #[arg(long)]
        count: Option<u64>,
    },
    /// Print the SQL that creates the lock tables in a database (schema `--schema`, else
    /// `distlock`), for the application's migrations; every statement may run again. Exit 0.
    Schema {
        /// The database: postgres, or mysql (MySQL 8.0+ and MariaDB 10.6+, for their command-line
        /// clients).
        store: Store,
    },
    /// Print the commands that give a lock user the rights locks need, and nothing more: the
    /// Redis ACL rules for the prefix (add `on >password` to enable the user), the etcd role
    /// for the prefix and its grant, or PostgreSQL's or MySQL's GRANTs on the schema. Run them
    /// as an administrator. Exit 0.
    Acl {
        /// redis (one server, Sentinel's primary and replicas, Redlock's masters),
        /// redis-cluster (on every node), etcd, postgres or mysql (the schema `--schema`).
        store: AclStore,
        /// The lock user (for mysql: `name`, any host, or `'name'@'host'`).
        #[arg(long, default_value = "distlock")]
        user: String,
    },
    /// Print a shell completion script: `distlock completions bash > /etc/bash_completion.d/distlock`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

/// The stores `distlock acl` prints the rights for.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum AclStore {
    Redis,
    RedisCluster,
    Etcd,
    Postgres,
    Mysql,
}

/// The databases `distlock schema` prints the SQL of.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Store {
    Postgres,
    Mysql,
}

/// Exit code: the lock is held, the command did what it was asked, nothing to fix.
const HELD: u8 = 0;
/// Exit code: the lock is free, nothing was removed, the doctor found something.
const FREE: u8 = 1;
/// Exit code: bad usage (clap's own code).
const USAGE: u8 = 2;
/// Exit code: the backend failed or is misconfigured.
const FAILED: u8 = 3;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("distlock: cannot start the async runtime: {err}");
            return ExitCode::from(FAILED);
        }
    };
    let format = if cli.json { Format::Json } else { Format::Text };
    match runtime.block_on(run(cli, format)) {
        Ok(code) => ExitCode::from(code),
        Err(Failure::Usage(message)) => {
            render::usage(format, &message);
            ExitCode::from(USAGE)
        }
        Err(Failure::Lock(err)) => {
            render::error(format, &err);
            ExitCode::from(FAILED)
        }
    }
}

enum Failure {
    Usage(String),
    Lock(LockError),
}

impl From<LockError> for Failure {
    fn from(err: LockError) -> Self {
        Failure::Lock(err)
    }
}

async fn run(cli: Cli, format: Format) -> Result<u8, Failure> {
    if let Command::Completions { shell } = cli.command {
        let mut command = <Cli as clap::CommandFactory>::command();
        clap_complete::generate(shell, &mut command, "distlock", &mut std::io::stdout());
        return Ok(HELD);
    }
    if let Command::Schema { store } = cli.command {
        return schema(store, cli.schema.as_deref());
    }
    if let Command::Acl { store, user } = &cli.command {
        return acl(*store, &cli.prefix, cli.schema.as_deref(), user);
    }
    if let Command::Unlock { key, force: false } = &cli.command {
        return Err(Failure::Usage(format!(
            "refusing to remove the lock `{key}` without --force: its holder keeps running \
             (only its fenced writes are rejected after the next holder's); check it with \
             `distlock inspect {key}` first"
        )));
    }
    let backend = connect::backend(&cli)?;
    match cli.command {
        Command::Inspect { keys } => {
            let mut all_held = true;
            for key in keys {
                let holder = backend.inspect(&key).await?;
                all_held &= holder.is_some();
                render::inspected(format, &backend, &key, holder.as_ref());
            }
            Ok(if all_held { HELD } else { FREE })
        }
        Command::List { pattern } => {
            let held = backend.list(&pattern).await?;
            render::listed(format, &backend, &held);
            Ok(if held.is_empty() { FREE } else { HELD })
        }
        Command::Doctor => {
            let findings = backend.doctor().await?;
            render::findings(format, &backend, &findings);
            Ok(if findings.is_empty() { HELD } else { FREE })
        }
        Command::Unlock { key, .. } => {
            let removed = backend.force_unlock(&key).await?;
            render::unlocked(format, &key, removed.as_ref());
            Ok(if removed.is_some() { HELD } else { FREE })
        }
        Command::Completions { .. } | Command::Schema { .. } | Command::Acl { .. } => {
            unreachable!("answered before connecting")
        }
        Command::Watch {
            key,
            enable_notifications,
            count,
        } => {
            let notifications = match enable_notifications {
                true => Notifications::Enable,
                false => Notifications::Require,
            };
            let mut events = backend.events(&key, notifications).await?;
            eprintln!(
                "watching `{key}` on {} backend ({}); Ctrl-C to stop",
                backend.deployment(),
                connect::describe(&cli.url)
            );
            let mut seen = 0;
            let mut failed = false;
            while count.is_none_or(|count| seen < count) {
                let next = tokio::select! {
                    next = events.next() => next,
                    _ = tokio::signal::ctrl_c() => break,
                };
                match next {
                    Some(Ok(event)) => render::event(format, &key, &event),
                    // Reported as it happens; the stream goes on (it resubscribes), and the exit
                    // code says that events may have been missed.
                    Some(Err(err)) => {
                        render::error(format, &err);
                        failed = true;
                    }
                    None => break,
                }
                seen += 1;
            }
            Ok(if failed { FAILED } else { HELD })
        }
    }
}

/// `distlock schema <store>`: the SQL on standard output.
fn schema(store: Store, name: Option<&str>) -> Result<u8, Failure> {
    let name = name.unwrap_or("distlock");
    match store {
        #[cfg(feature = "postgres")]
        Store::Postgres => {
            let sql =
                distlock::postgres::schema(name).map_err(|err| Failure::Usage(err.to_string()))?;
            print!("{sql}");
            Ok(HELD)
        }
        #[cfg(not(feature = "postgres"))]
        Store::Postgres => Err(Failure::Usage(format!(
            "this distlock was built without PostgreSQL; install it with `cargo install \
             distlock-cli --features postgres` to print the schema `{name}`"
        ))),
        #[cfg(feature = "mysql")]
        Store::Mysql => {
            let sql =
                distlock::mysql::schema(name).map_err(|err| Failure::Usage(err.to_string()))?;
            print!("{sql}");
            Ok(HELD)
        }
        #[cfg(not(feature = "mysql"))]
        Store::Mysql => Err(Failure::Usage(format!(
            "this distlock was built without MySQL; install it with `cargo install \
             distlock-cli --features mysql` to print the schema `{name}`"
        ))),
    }
}

/// `distlock acl <store>`: the commands on standard output.
fn acl(store: AclStore, prefix: &str, schema: Option<&str>, user: &str) -> Result<u8, Failure> {
    match store {
        AclStore::Redis => println!("ACL SETUSER {user} {}", distlock::redis::acl_rules(prefix)),
        AclStore::RedisCluster => println!(
            "ACL SETUSER {user} {}",
            distlock::redis::cluster_acl_rules(prefix)
        ),
        #[cfg(feature = "etcd")]
        AclStore::Etcd => print!("{}", distlock::etcd::acl_commands(prefix, user)),
        #[cfg(not(feature = "etcd"))]
        AclStore::Etcd => {
            return Err(Failure::Usage(
                "this distlock was built without etcd; install it with `cargo install \
                 distlock-cli --features etcd` to print the etcd role"
                    .to_owned(),
            ))
        }
        #[cfg(feature = "postgres")]
        AclStore::Postgres => {
            let schema = schema.unwrap_or("distlock");
            let sql = distlock::postgres::grants(schema, user)
                .map_err(|err| Failure::Usage(err.to_string()))?;
            print!("{sql}");
        }
        #[cfg(not(feature = "postgres"))]
        AclStore::Postgres => {
            let _ = schema;
            return Err(Failure::Usage(
                "this distlock was built without PostgreSQL; install it with `cargo install \
                 distlock-cli --features postgres` to print the GRANTs"
                    .to_owned(),
            ));
        }
        #[cfg(feature = "mysql")]
        AclStore::Mysql => {
            let schema = schema.unwrap_or("distlock");
            let sql = distlock::mysql::grants(schema, user)
                .map_err(|err| Failure::Usage(err.to_string()))?;
            print!("{sql}");
        }
        #[cfg(not(feature = "mysql"))]
        AclStore::Mysql => {
            let _ = schema;
            return Err(Failure::Usage(
                "this distlock was built without MySQL; install it with `cargo install \
                 distlock-cli --features mysql` to print the GRANTs"
                    .to_owned(),
            ));
        }
    }
    Ok(HELD)
}
