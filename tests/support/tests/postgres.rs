//! The PostgreSQL harness: a server of its own, a standby that follows it and takes over, and
//! PgBouncer in front of it.

use distlock_test_support::{PgBouncer, PgServer, PoolMode};

#[test]
fn a_server_a_standby_and_a_pooler_of_the_harness_own() {
    let mut primary = PgServer::start();
    assert_ne!(primary.port(), 5432, "never the machine's own server");
    primary.psql("CREATE TABLE t (v int); INSERT INTO t VALUES (1)");
    let standby = PgServer::standby_of(&primary, "standby1");
    // The standby replays what the primary writes, and takes writes once promoted.
    primary.psql("INSERT INTO t VALUES (2)");
    let bouncer = PgBouncer::start(&primary, PoolMode::Transaction);
    assert!(bouncer.url().starts_with("postgres://postgres@127.0.0.1:"));
    primary.kill();
    assert!(!primary.is_running());
    standby.promote();
    standby.psql("INSERT INTO t VALUES (3)");
    let rows = standby.psql("SELECT count(*) FROM t");
    assert!(rows == "2" || rows == "3", "{rows}");
    primary.restart();
    assert_eq!(primary.psql("SELECT count(*) FROM t"), "2");
}
