-- Billing exports reconciled with the estimates. Keep in step with the other backend's file of
-- this name.

-- One row per imported export (`gpuledger import billing FILE` or the billing collector),
-- keyed by its name: importing a file again under the same name replaces what it said. The
-- reconciliation report is kept as JSON, as it was at import.
CREATE TABLE billing_files (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    sha256 TEXT NOT NULL,
    imported_at BIGINT NOT NULL,
    report TEXT NOT NULL,
    -- The file's size and modification time when imported from a file (the billing
    -- collector imports a file again only when either changed).
    size_bytes BIGINT,
    modified BIGINT
);

-- What was billed per GPU and charge period [period_start, period_end): each matched line's
-- EffectiveCost shared among its host's GPUs by their present hours in the period (`hours`,
-- as known at import).
CREATE TABLE billed_gpu_periods (
    file_id BIGINT NOT NULL,
    gpu_id BIGINT NOT NULL,
    period_start BIGINT NOT NULL,
    period_end BIGINT NOT NULL,
    billed_usd DOUBLE PRECISION NOT NULL,
    hours BIGINT NOT NULL,
    PRIMARY KEY (file_id, gpu_id, period_start, period_end)
) WITHOUT ROWID;
CREATE INDEX billed_gpu_period ON billed_gpu_periods (gpu_id, period_start);

-- Rolled up like activity: an hour's billed share (NULL when no export covers it: an
-- estimate only), and per day the billed hours and their sum.
ALTER TABLE gpu_hours ADD COLUMN billed_usd DOUBLE PRECISION;
ALTER TABLE gpu_days ADD COLUMN billed_hours BIGINT NOT NULL DEFAULT 0;
ALTER TABLE gpu_days ADD COLUMN billed_usd DOUBLE PRECISION NOT NULL DEFAULT 0;
-- Still covering for the fleet-wide scans by hour, now with the billed share.
DROP INDEX gpu_hours_hour;
CREATE INDEX gpu_hours_hour ON gpu_hours (hour, gpu_id, act_n, act_sum, allocated, mem_max, billed_usd);
