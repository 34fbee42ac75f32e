-- Puts back the length and format checks of 001 for new rows. NOT VALID leaves rows
-- written since 002 in place: a version-2 fingerprint is 33 bytes, and an engine from
-- before 002 compares it with its own as a different request (422), never a replay.
ALTER TABLE idemflow_keys
    ADD CONSTRAINT idemflow_keys_scope_len CHECK (octet_length(scope) BETWEEN 1 AND 255) NOT VALID,
    ADD CONSTRAINT idemflow_keys_key_format CHECK (idempotency_key ~ '^[ -~]{1,255}$') NOT VALID,
    ADD CONSTRAINT idemflow_keys_flow_len CHECK (octet_length(flow) BETWEEN 1 AND 128) NOT VALID,
    ADD CONSTRAINT idemflow_keys_method_len CHECK (octet_length(method) BETWEEN 1 AND 16) NOT VALID,
    ADD CONSTRAINT idemflow_keys_route_len CHECK (octet_length(route) BETWEEN 1 AND 1024) NOT VALID,
    ADD CONSTRAINT idemflow_keys_fingerprint_len CHECK (octet_length(fingerprint) = 32) NOT VALID,
    ADD CONSTRAINT idemflow_keys_body_len CHECK (octet_length(request_body) <= 16777216) NOT VALID,
    ADD CONSTRAINT idemflow_keys_recovery_point_len CHECK (octet_length(recovery_point) BETWEEN 1 AND 128) NOT VALID,
    ADD CONSTRAINT idemflow_keys_phase_data_len CHECK (octet_length(phase_data::text) <= 1048576) NOT VALID,
    ADD CONSTRAINT idemflow_keys_lock_version CHECK (lock_version >= 1) NOT VALID,
    ADD CONSTRAINT idemflow_keys_attempts CHECK (attempts >= 0) NOT VALID,
    ADD CONSTRAINT idemflow_keys_last_error_len CHECK (octet_length(last_error) <= 4096) NOT VALID,
    ADD CONSTRAINT idemflow_keys_response_body_len CHECK (octet_length(response_body) <= 16777216) NOT VALID;
