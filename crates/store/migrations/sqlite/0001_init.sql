-- gpuledger schema v1 (SQLite). Times are unix seconds (UTC); hours and days are the unix
-- second of their start. Keep in step with ../postgres/0001_init.sql.

CREATE TABLE sources (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    last_success BIGINT,
    last_attempt BIGINT,
    last_error TEXT,
    last_error_at BIGINT
);

CREATE TABLE tokens (
    id INTEGER PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL,
    source TEXT NOT NULL,
    teams TEXT,
    created_at BIGINT NOT NULL
);

CREATE TABLE gpus (
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL UNIQUE,
    model TEXT NOT NULL,
    memory_mib BIGINT,
    host TEXT,
    cluster TEXT,
    cloud TEXT,
    region TEXT,
    instance_type TEXT,
    serial TEXT,
    pci_bus_id TEXT,
    mig_parent_uuid TEXT,
    mig_profile TEXT,
    labels TEXT NOT NULL,
    source TEXT NOT NULL,
    placeholder BIGINT NOT NULL DEFAULT 0,
    first_seen BIGINT NOT NULL,
    last_seen BIGINT NOT NULL,
    team TEXT NOT NULL,
    env TEXT NOT NULL,
    owner_reason TEXT NOT NULL,
    usd_per_hour DOUBLE PRECISION,
    rate_origin TEXT NOT NULL
);
CREATE INDEX gpus_team ON gpus (team);
CREATE INDEX gpus_host ON gpus (host);
CREATE INDEX gpus_parent ON gpus (mig_parent_uuid);

CREATE TABLE gpu_attrs (
    gpu_id BIGINT NOT NULL,
    attribute TEXT NOT NULL,
    source TEXT NOT NULL,
    value TEXT NOT NULL,
    observed_at BIGINT NOT NULL,
    PRIMARY KEY (gpu_id, attribute, source)
) WITHOUT ROWID;

CREATE TABLE samples (
    gpu_id BIGINT NOT NULL,
    ts BIGINT NOT NULL,
    util_pct DOUBLE PRECISION,
    mem_used_mib DOUBLE PRECISION,
    power_w DOUBLE PRECISION,
    sm_active DOUBLE PRECISION,
    source_id BIGINT NOT NULL,
    PRIMARY KEY (gpu_id, ts)
) WITHOUT ROWID;
CREATE INDEX samples_ts ON samples (ts);

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
    PRIMARY KEY (gpu_id, hour)
) WITHOUT ROWID;
-- Covering, so fleet-wide scans by hour (summary edges, series, heatmap) never touch the table.
CREATE INDEX gpu_hours_hour ON gpu_hours (hour, gpu_id, act_n, act_sum, allocated, mem_max);

CREATE TABLE gpu_days (
    gpu_id BIGINT NOT NULL,
    day BIGINT NOT NULL,
    present_hours BIGINT NOT NULL,
    known_hours BIGINT NOT NULL,
    act_sum DOUBLE PRECISION NOT NULL,
    idle_hours BIGINT NOT NULL,
    allocated_hours BIGINT NOT NULL,
    allocated_idle_hours BIGINT NOT NULL,
    mem_max DOUBLE PRECISION,
    -- Clustered by day: a summary reads a range of days for every GPU.
    PRIMARY KEY (day, gpu_id)
) WITHOUT ROWID;

CREATE TABLE allocations (
    id INTEGER PRIMARY KEY,
    gpu_id BIGINT NOT NULL,
    start_ts BIGINT NOT NULL,
    end_ts BIGINT,
    workload TEXT NOT NULL,
    kind TEXT NOT NULL,
    user_name TEXT,
    team TEXT,
    source TEXT NOT NULL,
    UNIQUE (gpu_id, workload, start_ts)
);
CREATE INDEX allocations_gpu_start ON allocations (gpu_id, start_ts);

CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
