-- checkpoints: one row per checkpoint record of the ledger, retired and abandoned ones included.
-- status: 'committed'; 'retired' (a restore found its files failing verification, or it was
-- retired by name: a 'retired' event); 'abandoned' (a later checkpoint of the run resumed from
-- before it, so the training it recorded was lost). Only 'committed' checkpoints count in
-- progress and consumption totals.
CREATE OR REPLACE VIEW checkpoints AS
WITH ckpt AS (
    SELECT * FROM ledger WHERE record = 'checkpoint'
),
retired AS (
    SELECT run_id, detail ->> '$.checkpoint_id' AS checkpoint_id,
           any_value(detail ->> '$.reason') AS reason
    FROM ledger
    WHERE record = 'event' AND event = 'retired'
    GROUP BY ALL
),
ordered AS (
    SELECT run_id, checkpoint_id, step, parent_id,
           lag(step) OVER (PARTITION BY run_id ORDER BY step) AS previous_step
    FROM ckpt
),
links AS MATERIALIZED (  -- materialized: planned as one equi-join, not a run-wide join
    SELECT o.run_id, p.step AS parent_step, o.step AS child_step, o.previous_step
    FROM ordered o JOIN ckpt p ON p.run_id = o.run_id AND p.checkpoint_id = o.parent_id
),
jumps AS (  -- a checkpoint resumed from before its predecessor: the steps between were lost
    SELECT run_id, parent_step, child_step FROM links WHERE parent_step < previous_step
),
abandoned AS (
    SELECT DISTINCT c.run_id, c.checkpoint_id
    FROM ckpt c JOIN jumps j
      ON j.run_id = c.run_id AND j.parent_step < c.step AND c.step < j.child_step
),
tagged AS (  -- tags given after the commit (`lakeckpt tag`): 'tag' events
    SELECT run_id, detail ->> '$.checkpoint_id' AS checkpoint_id,
           list(DISTINCT detail ->> '$.tag') AS tags
    FROM ledger
    WHERE record = 'event' AND event = 'tag'
    GROUP BY ALL
),
consumed AS (
    SELECT run_id, checkpoint_id, CAST(sum(rows) AS BIGINT) AS rows
    FROM ledger
    WHERE record = 'consumption'
    GROUP BY ALL
)
SELECT c.run_id,
       c.checkpoint_id,
       c.step,
       CASE WHEN r.checkpoint_id IS NOT NULL THEN 'retired'
            WHEN a.checkpoint_id IS NOT NULL THEN 'abandoned'
            ELSE 'committed' END                     AS status,
       r.reason                                      AS retired_reason,
       c.parent_id,
       list_sort(list_distinct(coalesce(c.tags, []::VARCHAR[])
                               || coalesce(t.tags, []::VARCHAR[])))  AS tags,
       c.world_size,
       c.source_format,
       c.source_location,
       c.source_table_id,
       c.source_version,
       coalesce(k.rows, 0)                           AS rows,
       c.config_hash,
       c.model_location,
       c.wall_time_s,
       c.committed_at
FROM ckpt c
LEFT JOIN retired r USING (run_id, checkpoint_id)
LEFT JOIN abandoned a USING (run_id, checkpoint_id)
LEFT JOIN tagged t USING (run_id, checkpoint_id)
LEFT JOIN consumed k USING (run_id, checkpoint_id)
ORDER BY c.run_id, c.step;
