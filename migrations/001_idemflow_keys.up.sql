-- idemflow key table: one row per (scope, idempotency key).
--
-- A row is created by the claim in the same transaction as a flow's first tx phase,
-- advanced (fenced by lock_version) as phases commit, and holds the stored response once
-- finished. Tables are created in the current schema (the first entry of search_path).

CREATE TABLE idemflow_keys (
    -- Who owns the key (an account or tenant resolved by the server) and the client's key.
    scope            text        NOT NULL,
    idempotency_key  text        NOT NULL,
    -- Identity of this row. Derived keys for external calls are built from it, so a key
    -- reused after expiry never yields the derived key of an earlier row.
    id               uuid        NOT NULL,
    -- The request, so that the work can be resumed without the client.
    flow             text        NOT NULL,
    method           text        NOT NULL,
    route            text        NOT NULL,
    fingerprint      bytea       NOT NULL, -- sha256 of method, route and canonical body
    request_body     bytea       NOT NULL,
    -- Progress: the last phase whose effects are durable, and data carried between phases.
    recovery_point   text        NOT NULL DEFAULT 'started',
    phase_data       jsonb       NOT NULL DEFAULT '{}',
    status           text        NOT NULL DEFAULT 'in_progress',
    -- Lease and fencing: lock_version is bumped by every takeover and checked by every
    -- phase commit; locked_until is database time.
    lock_version     bigint      NOT NULL DEFAULT 1,
    locked_until     timestamptz,
    attempts         integer     NOT NULL DEFAULT 1,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_error       text,
    -- The stored response, byte for byte (bytea, not jsonb, so replays are identical).
    response_status  smallint,
    response_headers jsonb,
    response_body    bytea,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,

    PRIMARY KEY (scope, idempotency_key),

    CONSTRAINT idemflow_keys_scope_len CHECK (octet_length(scope) BETWEEN 1 AND 255),
    CONSTRAINT idemflow_keys_key_format CHECK (idempotency_key ~ '^[ -~]{1,255}$'),
    CONSTRAINT idemflow_keys_flow_len CHECK (octet_length(flow) BETWEEN 1 AND 128),
    CONSTRAINT idemflow_keys_method_len CHECK (octet_length(method) BETWEEN 1 AND 16),
    CONSTRAINT idemflow_keys_route_len CHECK (octet_length(route) BETWEEN 1 AND 1024),
    CONSTRAINT idemflow_keys_fingerprint_len CHECK (octet_length(fingerprint) = 32),
    CONSTRAINT idemflow_keys_body_len CHECK (octet_length(request_body) <= 16777216),
    CONSTRAINT idemflow_keys_recovery_point_len CHECK (octet_length(recovery_point) BETWEEN 1 AND 128),
    CONSTRAINT idemflow_keys_phase_data_len CHECK (octet_length(phase_data::text) <= 1048576),
    CONSTRAINT idemflow_keys_status CHECK (status IN ('in_progress', 'finished', 'dead')),
    CONSTRAINT idemflow_keys_lock_version CHECK (lock_version >= 1),
    CONSTRAINT idemflow_keys_attempts CHECK (attempts >= 0),
    CONSTRAINT idemflow_keys_last_error_len CHECK (octet_length(last_error) <= 4096),
    -- A 5xx answer is never stored: it is transient by definition.
    CONSTRAINT idemflow_keys_response_status CHECK (response_status BETWEEN 100 AND 499),
    CONSTRAINT idemflow_keys_response_body_len CHECK (octet_length(response_body) <= 16777216),
    -- A finished row has its whole response and no lease; an unfinished one has neither.
    CONSTRAINT idemflow_keys_finished CHECK (
        (status = 'finished'
            AND recovery_point = 'finished'
            AND response_status IS NOT NULL
            AND response_headers IS NOT NULL
            AND response_body IS NOT NULL
            AND finished_at IS NOT NULL
            AND locked_until IS NULL)
        OR
        (status <> 'finished'
            AND response_status IS NULL
            AND response_body IS NULL
            AND finished_at IS NULL))
);

-- The sweeper's work list: unfinished keys by due time.
CREATE INDEX idemflow_keys_due_idx ON idemflow_keys (next_attempt_at) WHERE status = 'in_progress';

-- Retention: finished keys by finish time.
CREATE INDEX idemflow_keys_finished_idx ON idemflow_keys (finished_at) WHERE status = 'finished';

-- idemflow_fence raises unless exactly one row was updated by a fenced statement. The
-- engine pipelines a fenced update with COMMIT; raising aborts the transaction so the
-- COMMIT that follows cannot commit a stale executor's writes.
CREATE FUNCTION idemflow_fence(updated bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF updated <> 1 THEN
        RAISE EXCEPTION 'idemflow: lease lost (fenced update matched % rows)', updated
            USING ERRCODE = 'IF001';
    END IF;
    RETURN updated;
END
$$;
