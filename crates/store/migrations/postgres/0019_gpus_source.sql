-- Each source's GPUs counted from an index: every page shows the sources' freshness with
-- their GPU counts, and without it each source looked up every physical GPU's row (60 ms a
-- page for 10,350 GPUs, six sources). Keep in step with the other backend's file of this
-- name.
CREATE INDEX gpus_source ON gpus (source, mig_parent_uuid);
