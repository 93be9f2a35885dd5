-- checkpoints: one row per checkpoint record of the ledger, retired and abandoned ones included.
-- status: 'committed'; 'retired' (a restore found its files failing verification, or it was
-- retired by name: a 'retired' event); 'abandoned' (a later checkpoint of the run resumed from
-- before it, so the training it recorded was lost). Only 'committed' checkpoints count in
-- progress and consumption totals. The status is computed in _checkpoint_status.sql.
CREATE OR REPLACE VIEW checkpoints AS
WITH tagged AS (  -- tags given after the commit (`lakeckpt tag`): 'tag' events
    SELECT run_id, detail ->> '$.checkpoint_id' AS checkpoint_id,
           list(DISTINCT detail ->> '$.tag') AS tags
    FROM ledger
    WHERE record = 'event' AND event = 'tag'
    GROUP BY ALL
),
consumed AS (  -- _consumed: per-checkpoint totals, from the summaries `maintain` writes
    SELECT run_id, checkpoint_id, CAST(sum(rows) AS BIGINT) AS rows
    FROM _consumed
    GROUP BY ALL
)
SELECT c.run_id,
       c.checkpoint_id,
       c.step,
       st.status,
       st.retired_reason,
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
FROM ledger c
JOIN _checkpoint_status st USING (run_id, checkpoint_id)
LEFT JOIN tagged t USING (run_id, checkpoint_id)
LEFT JOIN consumed k USING (run_id, checkpoint_id)
WHERE c.record = 'checkpoint'
ORDER BY c.run_id, c.step;
