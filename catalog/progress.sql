-- progress: per run, Mixture source (source_key; null for a one-table run) and pass (segment, epoch), rows consumed by committed checkpoints against
-- the rows the pass delivers (a run branched with its reader going on from another run's: its
-- ancestors' checkpoints up to the branch count too, NOTE [ branched runs ]). Pass sizes come from 'round' events, else from 'segment' events
-- (follow segments) or the pinned snapshot's metadata (the _pass_sizes table connect() builds);
-- null when none is known. state: 'retired' (a Mixture source retired at a resume);
-- 'done' (the pass is consumed); 'stopped' (a Mixture source's
-- pass its Mixture ended before, on_exhausted='stop'); else its run's state from
-- _run_activity ('running', 'stale' or 'finished'); only a 'running' pass has an ETA. Packed
-- readers count tokens too (null otherwise); a Mixture source's share is its part of the run's
-- tokens (rows when one of its sources is not packed).
CREATE OR REPLACE VIEW progress AS
WITH RECURSIVE branched AS (  -- runs branched with their reader going on from the parent's
    SELECT run_id,
           arg_max(detail ->> '$.parent_run', committed_at)                 AS parent_run,
           arg_max(CAST(detail ->> '$.parent_step' AS BIGINT), committed_at) AS parent_step,
           arg_max(detail ->> '$.reader', committed_at)                     AS reader
    FROM ledger WHERE record = 'event' AND event = 'branch'
    GROUP BY run_id
),
ancestry AS (  -- each such run's ancestors, and the last step of each its lineage holds
    SELECT run_id, parent_run AS ancestor, parent_step AS upto, 1 AS depth
    FROM branched WHERE reader = 'continued'
    UNION ALL
    SELECT a.run_id, b.parent_run, b.parent_step, a.depth + 1
    FROM ancestry a JOIN branched b ON b.run_id = a.ancestor AND b.reader = 'continued'
    WHERE a.depth < 64
),
own AS (  -- _consumed: the consumption view's totals per checkpoint, from the summaries
          -- `maintain` writes (not every consumption row)
    SELECT k.run_id, k.source_key, k.segment, k.epoch, k.step, min(k.committed_at) AS committed_at,
           CAST(sum(k.rows) AS BIGINT) AS rows, CAST(sum(k.tokens) AS BIGINT) AS tokens
    FROM _consumed k
    JOIN _checkpoint_status c USING (run_id, checkpoint_id)
    WHERE c.status = 'committed'
    GROUP BY ALL
),
per_checkpoint AS (  -- a run's own, and its ancestors' up to its branch (its reader's passes)
    SELECT * FROM own
    UNION ALL
    SELECT a.run_id, o.source_key, o.segment, o.epoch, o.step, o.committed_at, o.rows, o.tokens
    FROM ancestry a JOIN own o ON o.run_id = a.ancestor AND o.step <= a.upto
),
running AS (
    SELECT *, CAST(sum(rows) OVER (PARTITION BY run_id, source_key, segment, epoch ORDER BY step) AS BIGINT) AS consumed,
              CAST(sum(tokens) OVER (PARTITION BY run_id, source_key, segment, epoch ORDER BY step) AS BIGINT) AS tokens_consumed
    FROM per_checkpoint
),
per_pass AS (
    SELECT run_id, source_key, segment, epoch,
           max(consumed)                  AS rows_consumed,
           max(tokens_consumed)           AS tokens_consumed,
           arg_min(consumed, step)        AS consumed_first,
           count(*)                       AS checkpoints,
           min(step)                      AS first_step,
           max(step)                      AS last_step,
           min(committed_at)              AS first_at,
           max(committed_at)              AS last_at
    FROM running
    GROUP BY ALL
),
passes AS (
    SELECT coalesce(c.run_id, p.run_id)   AS run_id,
           coalesce(c.source_key, p.source_key) AS source_key,
           coalesce(c.segment, p.segment) AS segment,
           coalesce(c.epoch, p.epoch)     AS epoch,
           coalesce(c.rows_consumed, 0)   AS rows_consumed,
           p.delivered                    AS rows_in_pass,
           coalesce(c.tokens_consumed, CASE WHEN p.tokens IS NOT NULL THEN 0 END) AS tokens_consumed,
           p.tokens                       AS tokens_in_pass,
           p.rows                         AS live_rows,
           p.from_version, p.to_version,
           c.consumed_first, c.checkpoints, c.first_step, c.last_step, c.first_at, c.last_at
    FROM per_pass c
    FULL JOIN _pass_sizes p
           ON p.run_id = c.run_id AND p.source_key IS NOT DISTINCT FROM c.source_key
          AND p.segment = c.segment AND p.epoch = c.epoch
    WHERE coalesce(c.run_id, p.run_id) IN (SELECT run_id FROM _checkpoint_status)
),
rated AS (
    SELECT *,
           CASE WHEN last_at > first_at
                THEN (rows_consumed - consumed_first)
                     / (date_diff('microsecond', first_at, last_at) / 1e6) END AS rows_per_s
    FROM passes
),
totals AS (  -- each Mixture source's consumption over the run's passes
    SELECT run_id, source_key, sum(rows_consumed) AS rows_all, sum(tokens_consumed) AS tokens_all
    FROM passes
    WHERE source_key IS NOT NULL
    GROUP BY ALL
),
shares AS (
    SELECT run_id, source_key,
           round(CASE WHEN count(tokens_all) OVER w = count(*) OVER w
                      THEN 100.0 * tokens_all / nullif(sum(tokens_all) OVER w, 0)
                      ELSE 100.0 * rows_all / nullif(sum(rows_all) OVER w, 0) END, 2) AS share
    FROM totals
    WINDOW w AS (PARTITION BY run_id)
),
stated AS (  -- a pass not done is as alive as its run: no ETA once the run is stale
    SELECT r.*,
           CASE WHEN r.source_key IN (SELECT e.detail->>'source_key' FROM events e
                                      WHERE e.run_id = r.run_id AND e.event = 'source_retired')
                THEN 'retired'  -- NOTE [ sources that change ] (checkpoint/recipe.py)
                WHEN rows_in_pass IS NOT NULL AND rows_consumed >= rows_in_pass THEN 'done'
                WHEN a.mixture_ended THEN 'stopped'
                ELSE coalesce(a.state, 'running') END                       AS state
    FROM rated r
    LEFT JOIN _run_activity a USING (run_id)
)
SELECT run_id,
       segment,
       epoch,
       state,
       rows_consumed,
       rows_in_pass,
       live_rows,
       round(100.0 * rows_consumed / nullif(rows_in_pass, 0), 2)           AS percent,
       rows_per_s,
       CASE WHEN state = 'done' THEN 0.0
            WHEN state = 'running' AND rows_per_s > 0
                 THEN (rows_in_pass - rows_consumed) / rows_per_s END        AS eta_s,
       from_version,
       to_version,
       coalesce(checkpoints, 0)                                              AS checkpoints,
       first_step,
       last_step,
       first_at,
       last_at,
       source_key,
       tokens_consumed,
       tokens_in_pass,
       share
FROM stated
LEFT JOIN shares USING (run_id, source_key)  -- null source keys match nothing: no share
ORDER BY run_id, source_key NULLS FIRST, segment, epoch;
