-- distlock's lock tables in the database `{schema}`, for MySQL 8.0+ and MariaDB 10.6+. Run once
-- (in a migration, with the mysql or mariadb client: the procedures are between DELIMITER
-- lines); every statement may run again. A lock user that does not own them needs the GRANTs
-- that `distlock acl mysql --schema {schema} --user <user>` prints, and nothing more: the
-- procedures run with the rights of the user that calls them (SQL SECURITY INVOKER), so a
-- read-only server refuses them as it refuses that user.
CREATE DATABASE IF NOT EXISTS {schema};

-- One row per lock that has a queue: a join locks it, so the joins of one key run in turn.
CREATE TABLE IF NOT EXISTS {schema}.locks (
    lock_key VARBINARY(2048) NOT NULL PRIMARY KEY
) ENGINE = InnoDB;

-- One row per contender: the holders and the waiters, in `token` order. The token comes from
-- AUTO_INCREMENT, which InnoDB keeps across restarts (MySQL 8.0+, MariaDB 10.2.4+) and hands
-- out in the order of the joins of one key, which run in turn.
CREATE TABLE IF NOT EXISTS {schema}.entries (
    token      BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    lock_key   VARBINARY(2048) NOT NULL,
    owner      VARBINARY(64)   NOT NULL,
    kind       VARBINARY(16)   NOT NULL,
    label      VARBINARY(512)  NOT NULL,
    expires_at DATETIME(6)     NOT NULL,
    PRIMARY KEY (token),
    UNIQUE KEY entry (lock_key, owner),
    KEY in_order (lock_key, token)
) ENGINE = InnoDB;

DELIMITER $$

-- Joins `p_key`'s queue (or keeps the place there, its time starting again) and reads it:
-- owner, token, kind, label, milliseconds left. The entry's presence is taken before anyone
-- can read the entry (see queue_present).
DROP PROCEDURE IF EXISTS {schema}.queue_join $$
CREATE PROCEDURE {schema}.queue_join(p_key VARBINARY(2048), p_owner VARBINARY(64),
                                     p_kind VARBINARY(16), p_label VARBINARY(512),
                                     p_ttl_ms BIGINT, p_wait_s INT)
SQL SECURITY INVOKER
BEGIN
    DECLARE mine BIGINT UNSIGNED DEFAULT NULL;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    CALL {schema}.queue_begin(p_wait_s);
    -- The key's row, locked (inserted or found): the joins of one key run in turn.
    INSERT INTO {schema}.locks (lock_key) VALUES (p_key)
        ON DUPLICATE KEY UPDATE lock_key = VALUES(lock_key);
    DELETE FROM {schema}.entries WHERE lock_key = p_key AND expires_at <= UTC_TIMESTAMP(6);
    INSERT INTO {schema}.entries (lock_key, owner, kind, label, expires_at)
        VALUES (p_key, p_owner, p_kind, p_label,
                UTC_TIMESTAMP(6) + INTERVAL p_ttl_ms * 1000 MICROSECOND)
        ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at);
    SELECT e.token INTO mine FROM {schema}.entries e
        WHERE e.lock_key = p_key AND e.owner = p_owner;
    CALL {schema}.queue_present(mine);
    SELECT e.owner, e.token, e.kind, e.label,
           CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), e.expires_at) DIV 1000 AS SIGNED)
        FROM {schema}.entries e WHERE e.lock_key = p_key ORDER BY e.token;
    COMMIT;
END $$

-- Deletes `p_owner`'s entry: 1 it was there, 0 it was not and the queue is empty, -1 it was
-- not and another entry is there. Then gives its presence back (and that of `p_token`, the
-- token its join read, which an entry deleted by another keeps).
DROP PROCEDURE IF EXISTS {schema}.queue_leave $$
CREATE PROCEDURE {schema}.queue_leave(p_key VARBINARY(2048), p_owner VARBINARY(64),
                                      p_token BIGINT UNSIGNED, p_wait_s INT)
SQL SECURITY INVOKER
BEGIN
    DECLARE live INT DEFAULT 0;
    DECLARE mine BIGINT UNSIGNED DEFAULT NULL;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    CALL {schema}.queue_begin(p_wait_s);
    SELECT e.token, e.expires_at > UTC_TIMESTAMP(6) INTO mine, live FROM {schema}.entries e
        WHERE e.lock_key = p_key AND e.owner = p_owner
        FOR UPDATE;
    DELETE FROM {schema}.entries WHERE lock_key = p_key AND owner = p_owner;
    CALL {schema}.queue_tidy(p_key);
    SELECT CAST(CASE WHEN live > 0 THEN 1
        WHEN EXISTS (SELECT 1 FROM {schema}.entries e
                     WHERE e.lock_key = p_key AND e.expires_at > UTC_TIMESTAMP(6)) THEN -1
        ELSE 0 END AS SIGNED);
    COMMIT;
    CALL {schema}.queue_absent(mine);
    CALL {schema}.queue_absent(p_token);
END $$

-- Starts the time of `p_owner`'s entry again: 1 renewed, 0 gone (the queue empty), -1 gone
-- (another entry there). Read back, not counted: an affected-row count depends on the
-- client's CLIENT_FOUND_ROWS.
DROP PROCEDURE IF EXISTS {schema}.queue_renew $$
CREATE PROCEDURE {schema}.queue_renew(p_key VARBINARY(2048), p_owner VARBINARY(64),
                                      p_ttl_ms BIGINT)
SQL SECURITY INVOKER
BEGIN
    DECLARE renewed INT DEFAULT 0;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    CALL {schema}.queue_begin(1);
    UPDATE {schema}.entries
        SET expires_at = UTC_TIMESTAMP(6) + INTERVAL p_ttl_ms * 1000 MICROSECOND
        WHERE lock_key = p_key AND owner = p_owner AND expires_at > UTC_TIMESTAMP(6);
    SELECT COUNT(*) INTO renewed FROM {schema}.entries e
        WHERE e.lock_key = p_key AND e.owner = p_owner AND e.expires_at > UTC_TIMESTAMP(6);
    SELECT CAST(CASE WHEN renewed > 0 THEN 1
        WHEN EXISTS (SELECT 1 FROM {schema}.entries e
                     WHERE e.lock_key = p_key AND e.expires_at > UTC_TIMESTAMP(6)) THEN -1
        ELSE 0 END AS SIGNED);
    COMMIT;
END $$

-- Deletes `p_owner`'s entry if it is still the one with `p_token`: 1 it did, 0 it did not.
DROP PROCEDURE IF EXISTS {schema}.queue_remove $$
CREATE PROCEDURE {schema}.queue_remove(p_key VARBINARY(2048), p_owner VARBINARY(64),
                                       p_token BIGINT UNSIGNED, p_wait_s INT)
SQL SECURITY INVOKER
BEGIN
    DECLARE removed INT DEFAULT 0;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    CALL {schema}.queue_begin(p_wait_s);
    DELETE FROM {schema}.entries WHERE lock_key = p_key AND owner = p_owner AND token = p_token;
    SET removed = ROW_COUNT();
    CALL {schema}.queue_tidy(p_key);
    SELECT CAST(removed AS SIGNED);
    COMMIT;
    CALL {schema}.queue_absent(p_token);
END $$

-- Takes the presence of the entry `p_token` on this session (a named lock `dl:<database>:<token>`
-- that its waiters block on), unless the session holds it already (a named lock taken twice
-- would need two releases).
DROP PROCEDURE IF EXISTS {schema}.queue_present $$
CREATE PROCEDURE {schema}.queue_present(p_token BIGINT UNSIGNED)
SQL SECURITY INVOKER
BEGIN
    DECLARE presence VARCHAR(64) DEFAULT CONCAT('dl:', DATABASE(), ':', p_token);
    IF NOT (IS_USED_LOCK(presence) <=> CONNECTION_ID()) THEN
        DO GET_LOCK(presence, 0);
    END IF;
END $$

-- Gives the presence of the entry `p_token` back, if this session holds it (NULL or 0: none).
DROP PROCEDURE IF EXISTS {schema}.queue_absent $$
CREATE PROCEDURE {schema}.queue_absent(p_token BIGINT UNSIGNED)
SQL SECURITY INVOKER
BEGIN
    IF p_token > 0 THEN
        DO RELEASE_LOCK(CONCAT('dl:', DATABASE(), ':', p_token));
    END IF;
END $$

-- Starts a request's transaction: READ COMMITTED (no gap locks between the keys of one table),
-- and waits of at most `p_wait_s` seconds for a row another transaction has locked (an
-- application's fenced transaction holding an entry: the request waits for it, a call at a
-- time).
DROP PROCEDURE IF EXISTS {schema}.queue_begin $$
CREATE PROCEDURE {schema}.queue_begin(p_wait_s INT)
SQL SECURITY INVOKER
BEGIN
    SET SESSION innodb_lock_wait_timeout = p_wait_s;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
END $$

-- Deletes the key's row once its queue is empty, unless a join holds it (never waited for: a
-- join waiting on an entry this transaction deleted would wait for it in turn).
DROP PROCEDURE IF EXISTS {schema}.queue_tidy $$
CREATE PROCEDURE {schema}.queue_tidy(p_key VARBINARY(2048))
SQL SECURITY INVOKER
BEGIN
    DECLARE free_key VARBINARY(2048) DEFAULT NULL;
    IF NOT EXISTS (SELECT 1 FROM {schema}.entries e WHERE e.lock_key = p_key) THEN
        SELECT l.lock_key INTO free_key FROM {schema}.locks l
            WHERE l.lock_key = p_key FOR UPDATE SKIP LOCKED;
        IF free_key IS NOT NULL THEN
            DELETE FROM {schema}.locks WHERE lock_key = p_key;
        END IF;
    END IF;
END $$

DELIMITER ;
