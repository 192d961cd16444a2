-- On PostgreSQL the time columns get a statistics target that keeps their range, so a time
-- past the last analysis is not taken for one row. SQLite's planner reads its indexes'
-- statistics from `ANALYZE` without such a target, so nothing changes here; the statement
-- below only gives this version a body. Keep in step with the other backend's file of this
-- name.
DELETE FROM meta WHERE key = 'time_statistics';
