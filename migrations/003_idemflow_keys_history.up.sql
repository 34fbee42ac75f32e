-- Operations: a key's history, the origin of its first attempt, and an index for
-- dead-lettered keys.
--
-- history is a JSON array of the key's attempts, oldest first, at most the engine's
-- Config.History entries (the newest are kept). Each entry is written by the statement
-- that ends the attempt (finish, release, dead-letter, park) or, for an attempt that
-- ended without one (a crash, a lease taken over), by the takeover after it; an
-- operator's re-drive and release add an entry of their own. No extra statement and no
-- extra commit is sent for it. See workflow.Attempt for the fields.
--
-- origin is an opaque text the engine's Origin hook gave when the key was claimed (such
-- as a W3C traceparent), so that later attempts and sweeps can refer to the request
-- that started the work.
--
-- Neither column is mentioned by an index, so writing them keeps updates HOT.
ALTER TABLE idemflow_keys
    ADD COLUMN history jsonb NOT NULL DEFAULT '[]',
    ADD COLUMN origin  text;

-- Operators' lists, the dead-lettered gauge and their retention: dead-lettered keys by
-- creation. A key enters it once, when it is dead-lettered, and leaves it when it is
-- re-driven or deleted. created_at never changes, and status is already mentioned by
-- the other partial indexes, so the index costs no HOT update of a live key.
CREATE INDEX idemflow_keys_dead_idx ON idemflow_keys (created_at) WHERE status = 'dead';
