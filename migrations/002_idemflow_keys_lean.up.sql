-- Leaner writes on the key table.
--
-- PostgreSQL rebuilds every CHECK constraint of a table for every INSERT and UPDATE, and
-- the engine already validates every length and format before it sends any SQL (keys,
-- scopes, flows, methods, routes, bodies, phase data, errors, responses). Those checks
-- cost about a third of the server's work on a fresh request and caught nothing the
-- engine does not, so they go. The checks that guard the states stay: a status is one of
-- three, a 5xx is never stored, and a finished row carries its whole response and no
-- lease (idemflow_keys_status, idemflow_keys_response_status, idemflow_keys_finished).
--
-- The fingerprint column now holds either a 32-byte sha256 (version 1, rows written
-- before this release) or a version byte followed by the sha256 (version 2).

ALTER TABLE idemflow_keys
    DROP CONSTRAINT idemflow_keys_scope_len,
    DROP CONSTRAINT idemflow_keys_key_format,
    DROP CONSTRAINT idemflow_keys_flow_len,
    DROP CONSTRAINT idemflow_keys_method_len,
    DROP CONSTRAINT idemflow_keys_route_len,
    DROP CONSTRAINT idemflow_keys_fingerprint_len,
    DROP CONSTRAINT idemflow_keys_body_len,
    DROP CONSTRAINT idemflow_keys_recovery_point_len,
    DROP CONSTRAINT idemflow_keys_phase_data_len,
    DROP CONSTRAINT idemflow_keys_lock_version,
    DROP CONSTRAINT idemflow_keys_attempts,
    DROP CONSTRAINT idemflow_keys_last_error_len,
    DROP CONSTRAINT idemflow_keys_response_body_len;
