-- consumption: one row per row range a (rank, worker) consumed between a checkpoint and its
-- parent, with the status of that checkpoint (see checkpoints.sql). Unordered: the view is the
-- large one, and every view built on it would pay for a sort; say ORDER BY in your query.
CREATE OR REPLACE VIEW consumption AS
SELECT l.run_id,
       l.checkpoint_id,
       l.step,
       c.status,
       l.committed_at,
       l.rank,
       l.worker,
       l.segment,
       l.epoch,
       l.file,
       l.row_group,
       l.row_start,
       l.row_end,
       l.rows,
       l.rows = l.row_end - l.row_start              AS exact,
       l.source_key,
       l.tokens  -- packed readers: tokens delivered in the row group's stream span (eos included)
FROM ledger l
JOIN _checkpoint_status c USING (run_id, checkpoint_id)
WHERE l.record = 'consumption';
