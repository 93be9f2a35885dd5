-- checkpoints: one row per checkpoint record of the ledger, retired and abandoned ones included.
-- status: 'committed'; 'retired' (a restore found its files failing verification, or it was
-- retired by name: a 'retired' event); 'abandoned' (a later checkpoint of the run resumed from
-- before it, so the training it recorded was lost). Only 'committed' checkpoints count in
-- progress and consumption totals. The status is computed in _checkpoint_status.sql.
-- removed_reason: why its model files are gone (a 'removed' event of retention or gc, or the
-- files absent from the checkpoint root when the connection was made), else null: such a
-- checkpoint cannot be restored, though what it trained still counts. removed_at: the event's
-- time.
CREATE OR REPLACE VIEW checkpoints AS
WITH tagged AS (  -- tags given after the commit (`lakeckpt tag`): 'tag' events
    SELECT run_id, detail ->> '$.checkpoint_id' AS checkpoint_id,
           list(DISTINCT detail ->> '$.tag') AS tags
    FROM ledger
    WHERE record = 'event' AND event = 'tag'
    GROUP BY ALL
),
removed AS (  -- model files removed by retention or gc: 'removed' events
    SELECT run_id, detail ->> '$.checkpoint_id' AS checkpoint_id,
           min(committed_at) AS removed_at, any_value(detail ->> '$.reason') AS reason
    FROM ledger
    WHERE record = 'event' AND event = 'removed'
    GROUP BY ALL
),
missing AS (  -- _missing_models: absent from the checkpoint root when connect() listed it
    SELECT DISTINCT run_id, model_location FROM _missing_models
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
       d.removed_at,
       CASE WHEN d.checkpoint_id IS NOT NULL OR m.run_id IS NOT NULL
            THEN coalesce(d.reason, 'model files absent from the checkpoint root') END
                                                     AS removed_reason,
       c.wall_time_s,
       c.committed_at
FROM ledger c
JOIN _checkpoint_status st USING (run_id, checkpoint_id)
LEFT JOIN tagged t USING (run_id, checkpoint_id)
LEFT JOIN consumed k USING (run_id, checkpoint_id)
LEFT JOIN removed d USING (run_id, checkpoint_id)
LEFT JOIN missing m ON m.run_id = c.run_id AND m.model_location = c.model_location
WHERE c.record = 'checkpoint'
ORDER BY c.run_id, c.step;
