-- The hours of a day listed in `group_dirty` whose group rows (`group_hours`) are exact:
-- today is always listed (every push changes its current hour), so without this list every
-- per-hour figure read today's hours from the per-GPU rows at each request. The refresher
-- builds the group rows of today's finished hours and lists them here; the pages read a
-- listed hour from its group rows. An hour leaves the list when anything its group rows sum
-- changes: its hour rows (the triggers below, on every statement that writes or removes
-- them), the group attributes or owner periods of a GPU with a row in that hour
-- (`group_dirty_days`), or a removed day row (its whole day). Rebuilding a day's group rows
-- takes its hours off the list (the day itself is then off `group_dirty`). Keep in step with
-- the other backend's file of this name.
CREATE TABLE group_clean_hours (
    hour BIGINT NOT NULL PRIMARY KEY
);

CREATE OR REPLACE FUNCTION group_dirty_days(g BIGINT, lo BIGINT, hi BIGINT) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO group_dirty (day) SELECT day FROM gpu_days
    WHERE gpu_id = g AND day >= lo - lo % 86400 AND day < hi
    ON CONFLICT (day) DO NOTHING;
    DELETE FROM group_clean_hours c WHERE c.hour >= lo - lo % 86400 AND c.hour < hi
    AND EXISTS (SELECT 1 FROM gpu_hours h WHERE h.gpu_id = g AND h.hour = c.hour);
$$;

CREATE OR REPLACE FUNCTION group_dirty_day_gone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO group_dirty (day) VALUES (OLD.day) ON CONFLICT (day) DO NOTHING;
    DELETE FROM group_clean_hours WHERE hour >= OLD.day AND hour < OLD.day + 86400;
    RETURN NULL;
END
$$;

-- The hours of the rows a statement wrote or removed (`changed`) leave the list.
CREATE FUNCTION group_hours_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM group_clean_hours WHERE hour IN (SELECT hour FROM changed);
    RETURN NULL;
END
$$;

CREATE TRIGGER group_hours_new AFTER INSERT ON gpu_hours REFERENCING NEW TABLE AS changed
FOR EACH STATEMENT EXECUTE FUNCTION group_hours_changed();
CREATE TRIGGER group_hours_set AFTER UPDATE ON gpu_hours REFERENCING NEW TABLE AS changed
FOR EACH STATEMENT EXECUTE FUNCTION group_hours_changed();
CREATE TRIGGER group_hours_was AFTER UPDATE ON gpu_hours REFERENCING OLD TABLE AS changed
FOR EACH STATEMENT EXECUTE FUNCTION group_hours_changed();
CREATE TRIGGER group_hours_gone AFTER DELETE ON gpu_hours REFERENCING OLD TABLE AS changed
FOR EACH STATEMENT EXECUTE FUNCTION group_hours_changed();
