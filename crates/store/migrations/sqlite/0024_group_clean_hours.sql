-- The hours of a day listed in `group_dirty` whose group rows are exact (on PostgreSQL, the
-- finished hours of today the refresher has built; see the other backend's file of this
-- name). SQLite lists none: its pages read a listed day from the per-GPU rows, fast enough at
-- the sizes it serves, and its writes keep no list up to date. The table is here so that
-- both backends' queries read the same tables. Keep in step with the other backend's file of
-- this name.
CREATE TABLE group_clean_hours (
    hour BIGINT NOT NULL PRIMARY KEY
);
