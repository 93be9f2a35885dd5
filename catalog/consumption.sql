-- consumption: one row per row range a (rank, worker) consumed between a checkpoint and its
-- parent, with the status of that checkpoint (see checkpoints.sql) and the source read: the
-- table (the run's, or its Mixture source's, 'source' event) and the version its pass read
-- (from the _pass_sizes table connect() builds out of the events: no second scan of the
-- ledger). Unordered: the view is the large one, and every view built on it would pay for a
-- sort; say ORDER BY in your query.
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
       l.tokens,  -- packed readers: tokens delivered in the row group's stream span (eos included)
       p.location                                    AS source_location,
       p.table_id                                    AS source_table_id,
       p.to_version                                  AS source_version
FROM ledger l
JOIN _checkpoint_status c USING (run_id, checkpoint_id)
LEFT JOIN _pass_sizes p
       ON p.run_id = l.run_id AND p.source_key IS NOT DISTINCT FROM l.source_key
      AND p.segment = l.segment AND p.epoch = l.epoch
WHERE l.record = 'consumption';
