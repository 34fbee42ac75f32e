DROP INDEX IF EXISTS idemflow_keys_dead_idx;
ALTER TABLE idemflow_keys
    DROP COLUMN IF EXISTS origin,
    DROP COLUMN IF EXISTS history;
