-- events: everything the ledger noted besides checkpoints and consumption: follow segments
-- ('segment'), passes ('round'), skipped commits, undelivered rows, restores and their
-- fallbacks, retired checkpoints, policy changes, failed compactions.
CREATE OR REPLACE VIEW events AS
SELECT run_id,
       nullif(checkpoint_id, '')                     AS checkpoint_id,
       nullif(step, -1)                              AS step,
       committed_at,
       event,
       TRY_CAST(detail ->> '$.segment' AS BIGINT)    AS segment,
       TRY_CAST(detail ->> '$.epoch' AS BIGINT)      AS epoch,
       TRY_CAST(detail ->> '$.rows' AS BIGINT)       AS rows,
       detail
FROM ledger
WHERE record = 'event'
ORDER BY run_id, committed_at, event;
