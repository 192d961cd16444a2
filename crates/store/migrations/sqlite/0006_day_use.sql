-- Used-by per day: for each physical GPU, UTC day and team its allocations name (`''` when
-- none), the team's share of the GPU's present hours that day (an hour held by n workloads
-- gives each 1/n; an allocation on a MIG instance holds its GPU). `GET /api/v1/used-by` and
-- the Teams page read whole days from here and only the window's partial edge days from the
-- allocations. Kept by the same re-roll as `gpu_days`; filled for existing data at start-up.
-- Keep in step with the other backend's file of this name.
CREATE TABLE gpu_day_use (
    gpu_id BIGINT NOT NULL,
    day BIGINT NOT NULL,
    team TEXT NOT NULL,
    held_hours DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (day, gpu_id, team)
) WITHOUT ROWID;

-- Allocated-but-idle hours per workload and day: for each physical GPU, UTC day, owner period
-- (`owner_from`: the `gpu_owners` period the hours fell in) and workload holding it, the
-- workload's share of the GPU's allocated-and-idle hours that day (an hour held by n workloads
-- gives each 1/n). The Waste page reads whole days from here and only the partial edge days
-- from the allocations. Kept with `gpu_day_use`; rebuilt when the idle threshold changes.
CREATE TABLE gpu_day_idle (
    gpu_id BIGINT NOT NULL,
    day BIGINT NOT NULL,
    owner_from BIGINT NOT NULL,
    workload TEXT NOT NULL,
    team TEXT NOT NULL,
    kind TEXT NOT NULL,
    hours DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (day, gpu_id, owner_from, workload, team)
) WITHOUT ROWID;
