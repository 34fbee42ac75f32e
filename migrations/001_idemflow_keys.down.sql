DROP FUNCTION IF EXISTS idemflow_fence(bigint);
DROP TABLE IF EXISTS idemflow_keys;
