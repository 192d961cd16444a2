-- A workload's average GPU utilization and memory over an allocation, as its scheduler's
-- accounting measured it (Slurm's gres/gpuutil and gres/gpumem).
ALTER TABLE allocations ADD COLUMN avg_util_pct DOUBLE PRECISION;
ALTER TABLE allocations ADD COLUMN avg_mem_mib DOUBLE PRECISION;
-- Which of an hour's figures came from those averages because no sample measured them:
-- 1 = the activity (act_n, act_sum), 2 = the memory (mem_max); 0 = none, as before. The
-- rollup clears and refills them whenever it rolls the hour, so they follow the allocations.
-- Keep in step with the other backend's file of this name.
ALTER TABLE gpu_hours ADD COLUMN evidence BIGINT NOT NULL DEFAULT 0;
