-- On PostgreSQL a removed allocation bumps the generation of the answers kept between
-- requests (`live.rs`). SQLite keeps none and marks nothing (migration 22); the statement
-- below only gives this version a body. Keep in step with the other backend's file of this
-- name.
DELETE FROM meta WHERE key = 'live_gen';
