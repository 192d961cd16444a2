-- What the kubernetes collector adds. Keep in step with the other backend's file of this name.

-- The workload that owns an allocation (`Deployment/llm-serve`), when the source names one.
ALTER TABLE allocations ADD COLUMN owner TEXT;

-- Another name a host goes by: dcgm-exporter's `Hostname` label is often the exporter pod's
-- name, which a Kubernetes source maps to the node it runs on. GPUs reported on an alias are
-- stored on the host it names.
CREATE TABLE host_aliases (
    alias TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    source TEXT NOT NULL,
    observed_at BIGINT NOT NULL
);
