-- Allocations by when they end (an open one at the end of time), for the holders of the hours
-- near now: a window's edge today asks for the allocations overlapping a few hours, and read
-- by GPU and start those are every allocation each GPU ever had (134 ms to 25 ms for 10,350
-- GPUs × 90 days). Keep in step with the other backend's file of this name.
CREATE INDEX allocations_end ON allocations (COALESCE(end_ts, 9223372036854775807));
