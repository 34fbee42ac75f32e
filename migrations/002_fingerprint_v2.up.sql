-- Fingerprints gain a version (workflow.Fingerprint): a v1 fingerprint is 32 bytes, the
-- sha256 of the RFC 8785 form; a v2 one is 33 bytes, the version byte 0x02 and the
-- sha256 of the exact canonical form. Rows of both kinds coexist until v1 rows age out
-- with retention. The length is the engine's to choose, so it is not checked here.
-- Dropping a CHECK takes no table scan.
ALTER TABLE idemflow_keys DROP CONSTRAINT idemflow_keys_fingerprint_len;
