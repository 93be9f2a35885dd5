-- recoveries: one row per restore: which checkpoint was restored, the run's newest committed
-- step at the time, the last step its previous owner reached (the restore event's
-- reached_step, when recorded), and the steps whose training was lost: those trained after the
-- restored checkpoint, committed or not, which the run trains again. From 'restore' events;
-- for runs without them (older ledgers), from 'restore_fallback' events. fallback: newer
-- checkpoints failing verification were skipped (the restore event says so; for events
-- written before it did, steps were lost).
CREATE OR REPLACE VIEW recoveries AS
WITH restore AS (
    SELECT run_id, committed_at AS restored_at,
           detail ->> '$.checkpoint_id'                    AS checkpoint_id,
           CAST(detail ->> '$.step' AS BIGINT)             AS step,
           TRY_CAST(detail ->> '$.newest_step' AS BIGINT)  AS newest_step,
           TRY_CAST(detail ->> '$.reached_step' AS BIGINT) AS reached_step,
           CAST(detail ->> '$.steps_lost' AS BIGINT)       AS recorded_lost,
           TRY_CAST(detail ->> '$.fallback' AS BOOLEAN)     AS recorded_fallback,
           'restore'                                       AS source_event
    FROM ledger WHERE record = 'event' AND event = 'restore'
),
fallback AS (
    SELECT run_id, committed_at AS restored_at,
           detail ->> '$.restored'                          AS checkpoint_id,
           CAST(detail ->> '$.step' AS BIGINT)              AS step,
           CAST(list_max(CAST(detail -> '$.skipped[*].step' AS BIGINT[])) AS BIGINT)
                                                            AS newest_step,
           CAST(NULL AS BIGINT)                             AS reached_step,
           'restore_fallback'                               AS source_event
    FROM ledger WHERE record = 'event' AND event = 'restore_fallback'
      AND run_id NOT IN (SELECT run_id FROM restore)
)
SELECT run_id, restored_at, checkpoint_id, step, newest_step, reached_step,
       greatest(coalesce(reached_step, newest_step, step), newest_step, step) - step
                                                            AS steps_lost,
       coalesce(recorded_fallback, recorded_lost > 0)      AS fallback,
       source_event
FROM restore
UNION ALL
SELECT run_id, restored_at, checkpoint_id, step, newest_step, reached_step,
       newest_step - step, TRUE, source_event
FROM fallback
ORDER BY run_id, restored_at;
