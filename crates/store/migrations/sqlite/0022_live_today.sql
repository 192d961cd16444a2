-- On PostgreSQL today's per-GPU counts are kept in memory between requests, and triggers mark
-- what their per-row check cannot see (`meta.live_gen`). A single SQLite file reads today's
-- counts quickly enough at each request, so nothing is kept and nothing is marked here; the
-- statement below only gives this version a body. Keep in step with the other backend's file
-- of this name.
DELETE FROM meta WHERE key = 'live_gen';
