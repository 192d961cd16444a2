-- The host each cloud instance is stored under: the first host name a source reported with the
-- instance's ID (`labels.instance_id`: an EC2 `i-…`, a GCE instance name, an Azure VM name).
-- Reports of the same instance under another name land on that host, and the other name
-- becomes one of its aliases. Keep in step with the other backend's file of this name.
CREATE TABLE host_instances (
    instance_id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    source TEXT NOT NULL,
    observed_at BIGINT NOT NULL
);
