-- distlock's lock tables in the schema `{schema}`. Run once (in a migration); every statement
-- may run again. A lock user that does not own them needs the GRANTs that
-- `distlock acl postgres --schema {schema} --user <role>` prints, and nothing more.
CREATE SCHEMA IF NOT EXISTS {schema};

-- Every entry's place in its queue, and its holder's fencing token.
CREATE SEQUENCE IF NOT EXISTS {schema}.tokens AS bigint;

-- One row per lock that has a queue: a join locks it, so the joins of one key run in turn.
CREATE TABLE IF NOT EXISTS {schema}.locks (
    key text PRIMARY KEY
);

-- One row per contender: the holders and the waiters, in `token` order.
CREATE TABLE IF NOT EXISTS {schema}.entries (
    key        text        NOT NULL,
    owner      text        NOT NULL,
    token      bigint      NOT NULL,
    kind       text        NOT NULL,
    label      text        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (key, owner)
);
CREATE INDEX IF NOT EXISTS entries_in_order ON {schema}.entries (key, token);

-- Tells the channel `{schema}` of a change: `j` joined, `r` renewed, `d` deleted.
CREATE OR REPLACE FUNCTION {schema}.told(op text, key text, owner text) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_notify('{schema}', op || E'\t' || key || E'\t' || owner || E'\t' || pg_current_xact_id()::text)
$$;

-- Joins `key`'s queue (or keeps the place there, its time starting again) and reads it.
-- Waits at most `p_wait_ms` for a row another transaction has locked (an application's fenced
-- transaction holding an expired entry: the takeover waits for it, a call at a time).
CREATE OR REPLACE FUNCTION {schema}.join(p_key text, p_owner text, p_kind text, p_label text,
                                         p_ttl_ms bigint, p_wait_ms bigint)
RETURNS TABLE (q_owner text, q_token bigint, q_kind text, q_label text, q_ms_left bigint, q_read_at bigint)
LANGUAGE plpgsql AS $$
DECLARE
    gone record;
BEGIN
    PERFORM set_config('lock_timeout', p_wait_ms || 'ms', true);
    -- The key's row, locked: the joins of one key run in turn. (A leave that empties the queue
    -- deletes the row only when no join holds it, so the loop ends at once or after one more
    -- round.)
    LOOP
        INSERT INTO {schema}.locks (key) VALUES (p_key) ON CONFLICT (key) DO NOTHING;
        PERFORM 1 FROM {schema}.locks l WHERE l.key = p_key FOR NO KEY UPDATE;
        EXIT WHEN FOUND;
    END LOOP;
    FOR gone IN DELETE FROM {schema}.entries e
            WHERE e.key = p_key AND e.expires_at <= clock_timestamp() RETURNING e.owner LOOP
        PERFORM {schema}.told('d', p_key, gone.owner);
    END LOOP;
    INSERT INTO {schema}.entries AS e (key, owner, token, kind, label, expires_at)
        VALUES (p_key, p_owner, nextval('{schema}.tokens'), p_kind, p_label,
                clock_timestamp() + p_ttl_ms * interval '1 millisecond')
        ON CONFLICT (key, owner) DO UPDATE SET expires_at = excluded.expires_at;
    PERFORM {schema}.told('j', p_key, p_owner);
    RETURN QUERY SELECT e.owner, e.token, e.kind, e.label,
            (extract(epoch FROM e.expires_at - clock_timestamp()) * 1000)::bigint,
            pg_snapshot_xmin(pg_current_snapshot())::text::bigint - 1
        FROM {schema}.entries e WHERE e.key = p_key ORDER BY e.token;
END
$$;

-- Deletes `p_owner`'s entry: 1 it was there, 0 it was not and the queue is empty, -1 it was
-- not and another entry is there. Waits at most `p_wait_ms` for a row another transaction has
-- locked (the holder's own fenced transaction, still open).
CREATE OR REPLACE FUNCTION {schema}.leave(p_key text, p_owner text, p_wait_ms bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    live boolean;
BEGIN
    PERFORM set_config('lock_timeout', p_wait_ms || 'ms', true);
    DELETE FROM {schema}.entries e WHERE e.key = p_key AND e.owner = p_owner
        RETURNING e.expires_at > clock_timestamp() INTO live;
    IF FOUND THEN
        PERFORM {schema}.told('d', p_key, p_owner);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM {schema}.entries e WHERE e.key = p_key) THEN
        -- The emptied queue's row goes, unless a join holds it (never waited for: a join
        -- waiting on an entry this call deleted would wait for this call in turn).
        DELETE FROM {schema}.locks l WHERE l.key IN
            (SELECT k.key FROM {schema}.locks k WHERE k.key = p_key FOR UPDATE SKIP LOCKED);
        RETURN CASE WHEN live THEN 1 ELSE 0 END;
    END IF;
    IF live THEN
        RETURN 1;
    END IF;
    RETURN CASE WHEN EXISTS (SELECT 1 FROM {schema}.entries e
        WHERE e.key = p_key AND e.expires_at > clock_timestamp()) THEN -1 ELSE 0 END;
END
$$;

-- Starts each entry's time again: one row per renewal, in order, 1 renewed, 0 gone (the queue
-- empty), -1 gone (another entry there).
CREATE OR REPLACE FUNCTION {schema}.renew(p_keys text[], p_owners text[], p_ttls_ms bigint[])
RETURNS TABLE (r_found integer)
LANGUAGE plpgsql AS $$
DECLARE
    renewed bigint[];
BEGIN
    WITH asked AS (SELECT * FROM unnest(p_keys, p_owners, p_ttls_ms) WITH ORDINALITY
                       AS a(key, owner, ttl_ms, at)),
         done AS (UPDATE {schema}.entries e
                      SET expires_at = clock_timestamp() + a.ttl_ms * interval '1 millisecond'
                      FROM asked a
                      WHERE e.key = a.key AND e.owner = a.owner
                        AND e.expires_at > clock_timestamp()
                      RETURNING a.at, {schema}.told('r', e.key, e.owner))
    SELECT coalesce(array_agg(done.at), '{}') INTO renewed FROM done;
    RETURN QUERY SELECT CASE
            WHEN a.at = ANY (renewed) THEN 1
            WHEN EXISTS (SELECT 1 FROM {schema}.entries e
                WHERE e.key = a.key AND e.expires_at > clock_timestamp()) THEN -1
            ELSE 0 END
        FROM unnest(p_keys) WITH ORDINALITY AS a(key, at) ORDER BY a.at;
END
$$;

-- Deletes `p_owner`'s entry if it is still the one with `p_token`; whether it did. Waits at
-- most `p_wait_ms` for a fenced transaction holding the entry.
CREATE OR REPLACE FUNCTION {schema}.remove(p_key text, p_owner text, p_token bigint, p_wait_ms bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('lock_timeout', p_wait_ms || 'ms', true);
    DELETE FROM {schema}.entries e WHERE e.key = p_key AND e.owner = p_owner AND e.token = p_token;
    IF FOUND THEN
        PERFORM {schema}.told('d', p_key, p_owner);
        RETURN true;
    END IF;
    RETURN false;
END
$$;
