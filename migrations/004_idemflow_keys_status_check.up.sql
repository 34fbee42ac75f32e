-- One CHECK constraint on the key table: a status is one of three.
--
-- PostgreSQL 15 rebuilds a table's CHECK expressions in every statement that writes a
-- row, prepared or not, and a fresh request writes its key row twice (the claim, the
-- finish). Of the three checks 002 kept, the two dropped here were about 125,000 of
-- the 160,000 instructions each of those writes spent on them (docs/BENCHMARKS.md, "The
-- key table's CHECK constraints"). What they guarded holds by construction:
--
--   * a 5xx is never stored: the engine refuses a status outside 200-499 before any
--     SQL (an attempt's answer, an operator's cancel);
--   * a finished row carries its whole response and no lease, an unfinished one none:
--     the only statements that set status = 'finished' set the recovery point, every
--     response column (never NULL: an empty body is stored as an empty one),
--     finished_at and locked_until = NULL with it, and no statement moves a finished
--     row to another status or clears its response.
--
-- The test suite checks both on every key row a test leaves behind (testkit/pgtest).
-- idemflow_keys_status stays: partition removal proves from it, without reading a row,
-- that a partition holds no key of a status a newer release added.
--
-- Dropping checks widens what the table accepts: the previous release runs on this
-- schema unchanged (docs/OPERATIONS.md, "Upgrades").

ALTER TABLE idemflow_keys
    DROP CONSTRAINT idemflow_keys_response_status,
    DROP CONSTRAINT idemflow_keys_finished;
