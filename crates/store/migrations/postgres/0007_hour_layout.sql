-- Raw samples and hour rollups partitioned by time (range partitions on `ts` and `hour`), so
-- retention drops whole partitions instead of deleting rows, and a query over a time range
-- reads only the partitions it covers. The server creates the partitions the retention
-- periods need (raw samples by day, hour rollups by week) at start-up and hourly, and drops
-- those past retention; a `_default` partition holds any row outside them and its rows move
-- into the partition created for them. The covering index by hour stays: PostgreSQL's
-- index-only scans need it. The index on `samples (ts)` goes: pruning drops partitions.
-- Keep in step with the other backend's file of this name.
ALTER TABLE samples RENAME TO samples_unpartitioned;
ALTER INDEX samples_pkey RENAME TO samples_unpartitioned_pkey;
DROP INDEX samples_ts;
CREATE TABLE samples (
    gpu_id BIGINT NOT NULL,
    ts BIGINT NOT NULL,
    util_pct DOUBLE PRECISION,
    mem_used_mib DOUBLE PRECISION,
    power_w DOUBLE PRECISION,
    sm_active DOUBLE PRECISION,
    source_id BIGINT NOT NULL,
    PRIMARY KEY (gpu_id, ts)
) PARTITION BY RANGE (ts);
CREATE TABLE samples_default PARTITION OF samples DEFAULT;
INSERT INTO samples (gpu_id, ts, util_pct, mem_used_mib, power_w, sm_active, source_id)
SELECT gpu_id, ts, util_pct, mem_used_mib, power_w, sm_active, source_id
FROM samples_unpartitioned;
DROP TABLE samples_unpartitioned;

ALTER TABLE gpu_hours RENAME TO gpu_hours_unpartitioned;
ALTER INDEX gpu_hours_pkey RENAME TO gpu_hours_unpartitioned_pkey;
DROP INDEX gpu_hours_hour;
CREATE TABLE gpu_hours (
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
    PRIMARY KEY (gpu_id, hour)
) PARTITION BY RANGE (hour);
CREATE TABLE gpu_hours_default PARTITION OF gpu_hours DEFAULT;
CREATE INDEX gpu_hours_hour ON gpu_hours (hour, gpu_id, act_n, act_sum, allocated, mem_max, billed_usd);
INSERT INTO gpu_hours (gpu_id, hour, samples, act_n, act_sum, mem_max, power_sum, power_n,
    allocated, billed_usd)
SELECT gpu_id, hour, samples, act_n, act_sum, mem_max, power_sum, power_n, allocated, billed_usd
FROM gpu_hours_unpartitioned;
DROP TABLE gpu_hours_unpartitioned;
