-- Ownership by the workloads holding a GPU, and cloud accounts. Keep in step with the other
-- backend's file of this name.

-- The cloud account, project or subscription a GPU is billed to (rules and contract prices
-- match it).
ALTER TABLE gpus ADD COLUMN account TEXT;

-- The workloads holding the GPU or its MIG instances now (or the last one that did), as JSON,
-- oldest first: what ownership rules on namespaces, pod labels or Slurm accounts read. Kept
-- from the allocations whenever they change.
ALTER TABLE gpus ADD COLUMN holders TEXT NOT NULL DEFAULT '[]';

-- What the source said of the workload beyond its name (namespace, pod and namespace labels
-- and annotations, Slurm account and partition), as JSON; null when it said nothing.
ALTER TABLE allocations ADD COLUMN context TEXT;
