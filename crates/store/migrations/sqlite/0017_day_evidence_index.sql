-- The index by GPU carries each day's known and idle hours too, so the waste findings' "last
-- busy day" and "last measured day" of every GPU are read from the index alone, newest first,
-- without a lookup of the table per row (123 ms to 31 ms for 10,350 GPUs × 90 days). Keep in
-- step with the other backend's file of this name.
DROP INDEX gpu_days_gpu;
CREATE INDEX gpu_days_gpu ON gpu_days (gpu_id, day, mem_max, known_hours, idle_hours);
