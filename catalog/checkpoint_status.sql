-- _checkpoint_status: the status of every checkpoint record (see checkpoints.sql), from the
-- few columns it needs. Internal: checkpoints, consumption and progress share it, so that a
-- progress query does not read every column of every checkpoint record.
CREATE OR REPLACE VIEW _checkpoint_status AS
WITH ckpt AS MATERIALIZED (
    SELECT run_id, checkpoint_id, step, parent_id FROM ledger WHERE record = 'checkpoint'
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
           lag(step) OVER w AS previous_step, lag(checkpoint_id) OVER w AS previous_id
    FROM ckpt
    WINDOW w AS (PARTITION BY run_id ORDER BY step)
),
links AS MATERIALIZED (  -- only checkpoints not built on their predecessor need their parent
    SELECT o.run_id, p.step AS parent_step, o.step AS child_step, o.previous_step
    FROM ordered o JOIN ckpt p ON p.run_id = o.run_id AND p.checkpoint_id = o.parent_id
    WHERE o.parent_id IS DISTINCT FROM o.previous_id
),
jumps AS (  -- a checkpoint resumed from before its predecessor: the steps between were lost
    SELECT run_id, parent_step, child_step FROM links WHERE parent_step < previous_step
),
abandoned AS (
    SELECT DISTINCT c.run_id, c.checkpoint_id
    FROM ckpt c JOIN jumps j
      ON j.run_id = c.run_id AND j.parent_step < c.step AND c.step < j.child_step
)
SELECT c.run_id,
       c.checkpoint_id,
       c.step,
       CASE WHEN r.checkpoint_id IS NOT NULL THEN 'retired'
            WHEN a.checkpoint_id IS NOT NULL THEN 'abandoned'
            ELSE 'committed' END                     AS status,
       r.reason                                      AS retired_reason
FROM ckpt c
LEFT JOIN retired r USING (run_id, checkpoint_id)
LEFT JOIN abandoned a USING (run_id, checkpoint_id);
