-- _run_activity: per run, whether it is still committing. Internal: progress and runs share it.
-- A run is 'stale' when its last commit (a checkpoint, or a restore that took the run over) is
-- older than max(factor * its median save interval, min_s) seconds: its owner stopped saving
-- without finishing (killed, hung, lost). factor and min_s are the DuckDB variables
-- lakeckpt_stale_factor (default 3) and lakeckpt_stale_min_s (default 60), which
-- connect(stale_after=) and `--stale-after` set. A 'finished' event newer than the last
-- checkpoint (the owning process ended normally) makes it 'finished', and so does a
-- 'mixture_ended' event with its last checkpoint (its Mixture ended: on_exhausted='stop';
-- mixture_ended is then true).
CREATE OR REPLACE VIEW _run_activity AS
WITH saves AS (
    SELECT run_id, step, committed_at,
           date_diff('microsecond', lag(committed_at) OVER (PARTITION BY run_id
                                                            ORDER BY committed_at),
                     committed_at) / 1e6                       AS interval_s
    FROM ledger
    WHERE record = 'checkpoint'
),
per_run AS (
    SELECT run_id,
           count(*)                        AS saves,
           arg_max(step, committed_at)     AS last_step,
           max(committed_at)               AS last_save_at,
           median(interval_s)              AS save_interval_s
    FROM saves
    GROUP BY run_id
),
marks AS (  -- restores and claims are signs of life too; 'finished' ends the run
    SELECT run_id,
           max(committed_at) FILTER (WHERE event IN ('restore', 'claim', 'restart', 'branch'))
                                           AS last_claim_at,
           max(committed_at) FILTER (WHERE event = 'finished') AS finished_at,
           max(committed_at) FILTER (WHERE event = 'mixture_ended') AS ended_at
    FROM ledger
    WHERE record = 'event'
      AND event IN ('restore', 'claim', 'restart', 'branch', 'finished', 'mixture_ended')
    GROUP BY run_id
),
timed AS (
    SELECT p.run_id, p.saves, p.last_step, p.save_interval_s,
           greatest(m.finished_at, m.ended_at)                         AS finished_at,
           m.ended_at,
           greatest(p.last_save_at, coalesce(m.last_claim_at, p.last_save_at)) AS last_commit_at,
           greatest(CAST(coalesce(getvariable('lakeckpt_stale_factor'), 3) AS DOUBLE)
                    * coalesce(p.save_interval_s, 0.0),
                    CAST(coalesce(getvariable('lakeckpt_stale_min_s'), 60) AS DOUBLE))
                                           AS stale_after_s
    FROM per_run p
    LEFT JOIN marks m USING (run_id)
)
SELECT run_id, saves, last_step, last_commit_at, save_interval_s,
       date_diff('microsecond', last_commit_at, now()) / 1e6      AS idle_s,
       stale_after_s,
       finished_at,
       coalesce(ended_at >= last_commit_at, FALSE)                 AS mixture_ended,
       CASE WHEN finished_at >= last_commit_at THEN 'finished'
            WHEN date_diff('microsecond', last_commit_at, now()) / 1e6 > stale_after_s
                 THEN 'stale'
            ELSE 'running' END                                     AS state
FROM timed;
