-- Puts back the length and format checks of 001. Rows written since 002 that break one
-- of them (a version-2 fingerprint is 33 bytes) make this fail; nothing is changed then.
ALTER TABLE idemflow_keys
    ADD CONSTRAINT idemflow_keys_scope_len CHECK (octet_length(scope) BETWEEN 1 AND 255),
    ADD CONSTRAINT idemflow_keys_key_format CHECK (idempotency_key ~ '^[ -~]{1,255}$'),
    ADD CONSTRAINT idemflow_keys_flow_len CHECK (octet_length(flow) BETWEEN 1 AND 128),
    ADD CONSTRAINT idemflow_keys_method_len CHECK (octet_length(method) BETWEEN 1 AND 16),
    ADD CONSTRAINT idemflow_keys_route_len CHECK (octet_length(route) BETWEEN 1 AND 1024),
    ADD CONSTRAINT idemflow_keys_fingerprint_len CHECK (octet_length(fingerprint) = 32),
    ADD CONSTRAINT idemflow_keys_body_len CHECK (octet_length(request_body) <= 16777216),
    ADD CONSTRAINT idemflow_keys_recovery_point_len CHECK (octet_length(recovery_point) BETWEEN 1 AND 128),
    ADD CONSTRAINT idemflow_keys_phase_data_len CHECK (octet_length(phase_data::text) <= 1048576),
    ADD CONSTRAINT idemflow_keys_lock_version CHECK (lock_version >= 1),
    ADD CONSTRAINT idemflow_keys_attempts CHECK (attempts >= 0),
    ADD CONSTRAINT idemflow_keys_last_error_len CHECK (octet_length(last_error) <= 4096),
    ADD CONSTRAINT idemflow_keys_response_body_len CHECK (octet_length(response_body) <= 16777216);
