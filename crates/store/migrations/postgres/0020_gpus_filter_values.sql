-- The filter pickers on every page list the distinct environments, clouds, clusters and
-- models of the fleet: without an index each was a scan of every GPU's row (about 12 ms a
-- page for 10,350 GPUs, before any of the page's own reads). Team and vendor have theirs
-- already. Ingest's hot path updates only `last_seen`, which none of them holds. Keep in step
-- with the other backend's file of this name.
CREATE INDEX gpus_env ON gpus (env);
CREATE INDEX gpus_cloud ON gpus (cloud);
CREATE INDEX gpus_cluster ON gpus (cluster);
CREATE INDEX gpus_model ON gpus (model);
