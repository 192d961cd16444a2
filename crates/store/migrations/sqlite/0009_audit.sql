-- The audit log: who wrote what and who was refused, aggregated per minute so that a flood of
-- requests adds one row per minute, not one per request. `source` is the token's source ('' for
-- a token the server does not know), `actor` how it wrote (push, agent, a collector's kind, or
-- `cli` for token administration), `outcome` `ok`, `partial`, `rejected` or the refusal
-- (`429 rate limit`, `401 unknown token`, ...). Pruned after `[retention] audit_days`.
-- Keep in step with the other backend's file of this name.
CREATE TABLE audit_log (
    minute BIGINT NOT NULL,
    source TEXT NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    outcome TEXT NOT NULL,
    requests BIGINT NOT NULL DEFAULT 0,
    records BIGINT NOT NULL DEFAULT 0,
    rejected BIGINT NOT NULL DEFAULT 0,
    duplicates BIGINT NOT NULL DEFAULT 0,
    new_gpus BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, source, actor, action, outcome)
);
CREATE INDEX audit_log_source ON audit_log (source, minute);
