-- deletions: rows a run's source table deleted after the run pinned it, taken out of the run's
-- pass (deletes="honor"): one line per deleting commit and range of deleted rows, with the
-- checkpoint whose commit took them out (after it no checkpoint of the run trains on them).
-- file, row_group, row_start, row_end: live rows of the row group at the pin, as consumption
-- records count them; excluded_rows: rows of the commit not delivered yet when it was applied.
CREATE OR REPLACE VIEW deletions AS
SELECT e.run_id,
       e.checkpoint_id                                        AS applied_by_checkpoint,
       e.step                                                 AS applied_at_step,
       e.committed_at,
       CAST(e.detail ->> '$.version' AS BIGINT)               AS version,
       e.detail ->> '$.operation'                             AS operation,
       e.detail ->> '$.how'                                   AS how,
       r ->> 0                                                AS file,
       CAST(r ->> 1 AS INTEGER)                               AS row_group,
       CAST(r ->> 2 AS BIGINT)                                AS row_start,
       CAST(r ->> 3 AS BIGINT)                                AS row_end,
       CAST(r ->> 3 AS BIGINT) - CAST(r ->> 2 AS BIGINT)      AS rows,
       CAST(e.detail ->> '$.excluded_rows' AS BIGINT)         AS excluded_rows
FROM ledger AS e, unnest(CAST(json_extract(e.detail, '$.deleted') AS JSON[])) AS t(r)
WHERE e.record = 'event' AND e.event = 'excluded'
ORDER BY e.run_id, e.step, version, file, row_group, row_start;
