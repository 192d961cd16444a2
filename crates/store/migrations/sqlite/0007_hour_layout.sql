-- The hour rollups clustered by hour: the fleet-wide scans by hour (summary edges, the trend,
-- the heatmap) read the table itself in order, so the covering index they needed, which held
-- a second copy of every row, goes. A narrow unique index by GPU serves the per-GPU reads (a
-- GPU's page, day re-rolls) and the upserts' conflict target. About 35 % fewer bytes per
-- GPU-hour. Keep in step with the other backend's file of this name.
CREATE TABLE gpu_hours_by_hour (
    gpu_id BIGINT NOT NULL,
    hour BIGINT NOT NULL,
    samples BIGINT NOT NULL DEFAULT 0,
    act_n BIGINT NOT NULL DEFAULT 0,
    act_sum DOUBLE PRECISION NOT NULL DEFAULT 0,
    mem_max DOUBLE PRECISION,
    power_sum DOUBLE PRECISION NOT NULL DEFAULT 0,
    power_n BIGINT NOT NULL DEFAULT 0,
    allocated BIGINT NOT NULL DEFAULT 0,
    billed_usd DOUBLE PRECISION,
    PRIMARY KEY (hour, gpu_id)
) WITHOUT ROWID;
INSERT INTO gpu_hours_by_hour (gpu_id, hour, samples, act_n, act_sum, mem_max, power_sum,
    power_n, allocated, billed_usd)
SELECT gpu_id, hour, samples, act_n, act_sum, mem_max, power_sum, power_n, allocated, billed_usd
FROM gpu_hours ORDER BY hour, gpu_id;
DROP TABLE gpu_hours;
ALTER TABLE gpu_hours_by_hour RENAME TO gpu_hours;
CREATE UNIQUE INDEX gpu_hours_gpu ON gpu_hours (gpu_id, hour);
