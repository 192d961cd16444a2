-- Running totals of each GPU's day rows: each `run_*` is the sum of its column over the GPU's
-- day rows up to and including this one. A GPU's sums over a range of whole days are then its
-- last row's running totals less its first row's, plus the first row's own figures: two rows
-- per GPU instead of one per day, however long the range. The rollup recomputes a GPU's
-- running totals from the first day it re-rolls onward, in the same transaction. Rows pruned
-- past retention take nothing from the later differences. A maximum has no running form: the
-- index by GPU carries each day's peak memory, so a GPU's peak over a range is read from the
-- index alone. Keep in step with the other backend's file of this name.
ALTER TABLE gpu_days ADD COLUMN run_present BIGINT NOT NULL DEFAULT 0;
ALTER TABLE gpu_days ADD COLUMN run_known BIGINT NOT NULL DEFAULT 0;
ALTER TABLE gpu_days ADD COLUMN run_act DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE gpu_days ADD COLUMN run_idle BIGINT NOT NULL DEFAULT 0;
ALTER TABLE gpu_days ADD COLUMN run_alloc BIGINT NOT NULL DEFAULT 0;
ALTER TABLE gpu_days ADD COLUMN run_alloc_idle BIGINT NOT NULL DEFAULT 0;
ALTER TABLE gpu_days ADD COLUMN run_b_hours BIGINT NOT NULL DEFAULT 0;
ALTER TABLE gpu_days ADD COLUMN run_b_usd DOUBLE PRECISION NOT NULL DEFAULT 0;
UPDATE gpu_days SET run_present = r.p, run_known = r.k, run_act = r.a, run_idle = r.i,
    run_alloc = r.al, run_alloc_idle = r.ai, run_b_hours = r.bh, run_b_usd = r.bu
FROM (SELECT gpu_id AS gid, day AS dday,
        SUM(present_hours) OVER w AS p, SUM(known_hours) OVER w AS k, SUM(act_sum) OVER w AS a,
        SUM(idle_hours) OVER w AS i, SUM(allocated_hours) OVER w AS al,
        SUM(allocated_idle_hours) OVER w AS ai, SUM(billed_hours) OVER w AS bh,
        SUM(billed_usd) OVER w AS bu
      FROM gpu_days
      WINDOW w AS (PARTITION BY gpu_id ORDER BY day ROWS UNBOUNDED PRECEDING)) r
WHERE gpu_days.gpu_id = r.gid AND gpu_days.day = r.dday;
DROP INDEX gpu_days_gpu;
CREATE INDEX gpu_days_gpu ON gpu_days (gpu_id, day, mem_max);
