-- follow_lag: per run, the newest version of its source table (looked up when the connection
-- was made) against the newest version its committed checkpoints read up to.
CREATE OR REPLACE VIEW follow_lag AS
WITH latest AS (
    SELECT run_id,
           arg_max(checkpoint_id, step)   AS checkpoint_id,
           max(step)                      AS step,
           max(committed_at)              AS committed_at,
           arg_max(source_format, step)   AS source_format,
           arg_max(source_location, step) AS source_location,
           arg_max(source_version, step)  AS pinned_version
    FROM checkpoints
    WHERE status = 'committed'
    GROUP BY run_id
),
reached AS (  -- the last pass each run's committed checkpoints reached, by its to_version
    SELECT e.run_id,
           arg_max(coalesce(TRY_CAST(e.detail ->> '$.to_version' AS BIGINT),
                            TRY_CAST(e.detail ->> '$.version' AS BIGINT)),
                   [e.step, e.segment])                         AS version,
           count(*) FILTER (WHERE e.event = 'segment')          AS segments
    FROM events e JOIN checkpoints c USING (run_id, checkpoint_id)
    WHERE c.status = 'committed' AND e.event IN ('segment', 'round')
    GROUP BY e.run_id
)
SELECT l.run_id,
       l.source_format,
       l.source_location,
       coalesce(r.segments, 0) > 0                            AS follow,
       coalesce(r.version, l.pinned_version)                  AS committed_version,
       v.latest_version                                       AS table_version,
       CASE WHEN l.source_format = 'delta'
            THEN v.latest_version - coalesce(r.version, l.pinned_version) END
                                                              AS versions_behind,
       l.step                                                 AS last_step,
       l.committed_at                                         AS last_commit_at,
       v.checked_at
FROM latest l
LEFT JOIN reached r USING (run_id)
LEFT JOIN _source_versions v ON v.location = l.source_location
ORDER BY l.run_id;
