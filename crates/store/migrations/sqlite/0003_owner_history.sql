-- Owner history. Keep in step with the other backend's file of this name.

-- Where each current attribute value came from: {"label.team": {"value", "source", "at"}, ...},
-- so an owner's reason can name the source value a rule matched and when it was seen.
ALTER TABLE gpus ADD COLUMN attr_seen TEXT NOT NULL DEFAULT '{}';

-- Who owned a GPU when: periods [from_ts, to_ts) that never overlap, hour-aligned. A change of
-- owner or environment (a label changed, or the rules changed) closes the open period at the
-- hour of the change and opens a new one, so history before the change keeps its owner unless
-- `gpuledger reattribute --from DATE` rewrites it. The open period ends at 253402300800
-- (year 10000).
CREATE TABLE gpu_owners (
    gpu_id BIGINT NOT NULL,
    from_ts BIGINT NOT NULL,
    to_ts BIGINT NOT NULL,
    team TEXT NOT NULL,
    env TEXT NOT NULL,
    reason TEXT NOT NULL,
    PRIMARY KEY (gpu_id, from_ts)
) WITHOUT ROWID;

-- Filters by team or environment start from the owner periods that match.
CREATE INDEX gpu_owners_team ON gpu_owners (team, gpu_id);
CREATE INDEX gpu_owners_env ON gpu_owners (env, gpu_id);

-- Every GPU stored so far owned by its current owner for all its history.
INSERT INTO gpu_owners (gpu_id, from_ts, to_ts, team, env, reason)
SELECT id, 0, 253402300800, team, env, owner_reason FROM gpus;
