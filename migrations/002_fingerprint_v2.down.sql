-- Back to 32-byte fingerprints for new rows. NOT VALID leaves the rows that hold a
-- 33-byte v2 fingerprint in place: a build before v2 compares them as different
-- requests, so their retries are answered 422, never replayed as another request.
ALTER TABLE idemflow_keys ADD CONSTRAINT idemflow_keys_fingerprint_len
    CHECK (octet_length(fingerprint) = 32) NOT VALID;
