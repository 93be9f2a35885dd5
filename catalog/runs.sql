-- runs: one row per run of the ledger, its state told from the ledger alone.
-- state: 'finished' (every pass it plans is consumed by committed checkpoints, or a 'finished'
-- event says its process ended normally after its last save); 'stale' (its owner stopped
-- saving without finishing: see _run_activity, run_activity.sql); else 'running'. A follow run
-- never finishes by consumption: it waits for appends, and turns 'stale' when it stops saving
-- (follow_lag says whether its table moved on meanwhile). parent_run, parent_step,
-- parent_checkpoint: where a branched run started (its 'branch' event), null for others.
CREATE OR REPLACE VIEW runs AS
WITH passes AS (
    SELECT run_id,
           count(*)                                                         AS passes,
           count(*) FILTER (WHERE rows_in_pass IS NOT NULL
                                  AND rows_consumed >= rows_in_pass)        AS passes_done,
           CAST(sum(rows_consumed) AS BIGINT)                               AS rows_consumed
    FROM progress
    GROUP BY run_id
),
follows AS (
    SELECT DISTINCT run_id FROM ledger WHERE record = 'event' AND event = 'segment'
),
branched AS (  -- a run started from another run's checkpoint: its parent in the tree
    SELECT run_id,
           arg_max(detail ->> '$.parent_run', committed_at)                    AS parent_run,
           arg_max(CAST(detail ->> '$.parent_step' AS BIGINT), committed_at)    AS parent_step,
           arg_max(detail ->> '$.parent_checkpoint_id', committed_at)          AS parent_checkpoint
    FROM ledger WHERE record = 'event' AND event = 'branch'
    GROUP BY run_id
),
committed AS (
    SELECT run_id,
           count(*) FILTER (WHERE status = 'committed')  AS checkpoints,
           arg_max(source_format, step)                  AS source_format,
           arg_max(source_location, step)                AS source_location
    FROM checkpoints
    GROUP BY run_id
)
SELECT a.run_id,
       CASE WHEN a.state = 'finished' THEN 'finished'
            WHEN f.run_id IS NULL AND p.passes > 0 AND p.passes_done = p.passes
                 THEN 'finished'
            ELSE a.state END                                AS state,
       f.run_id IS NOT NULL                                 AS follow,
       coalesce(c.checkpoints, 0)                           AS checkpoints,
       a.last_step,
       a.last_commit_at,
       a.save_interval_s,
       a.idle_s,
       a.stale_after_s,
       coalesce(p.passes, 0)                                AS passes,
       coalesce(p.passes_done, 0)                           AS passes_done,
       coalesce(p.rows_consumed, 0)                         AS rows_consumed,
       c.source_format,
       c.source_location,
       b.parent_run,
       b.parent_step,
       b.parent_checkpoint
FROM _run_activity a
LEFT JOIN passes p USING (run_id)
LEFT JOIN follows f USING (run_id)
LEFT JOIN committed c USING (run_id)
LEFT JOIN branched b USING (run_id)
ORDER BY a.run_id;
