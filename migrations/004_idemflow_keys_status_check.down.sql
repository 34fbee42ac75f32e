-- Puts back the two state checks 004 dropped, for new rows. NOT VALID leaves the rows
-- in place without a scan under the table's lock; every row the engine wrote satisfies
-- them (VALIDATE CONSTRAINT proves it, at an operator's choosing).
ALTER TABLE idemflow_keys
    ADD CONSTRAINT idemflow_keys_response_status CHECK (response_status BETWEEN 100 AND 499) NOT VALID,
    ADD CONSTRAINT idemflow_keys_finished CHECK (
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
            AND finished_at IS NULL)) NOT VALID;
