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
    report TEXT NOT NULL
);

-- What was billed per GPU and charge period [period_start, period_end): each matched line's
-- EffectiveCost shared among its host's GPUs by their present hours in the period. Costs over
-- a window show the billed share of the window's hours in these periods beside the estimate.
CREATE TABLE billed_gpu_periods (
    file_id BIGINT NOT NULL,
    gpu_id BIGINT NOT NULL,
    period_start BIGINT NOT NULL,
    period_end BIGINT NOT NULL,
    billed_usd DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (file_id, gpu_id, period_start, period_end)
) WITHOUT ROWID;
CREATE INDEX billed_gpu_period ON billed_gpu_periods (gpu_id, period_start);
