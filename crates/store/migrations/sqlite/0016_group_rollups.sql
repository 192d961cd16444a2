-- Rollups per owner group (team, environment, cloud, cluster, model, vendor): what the fleet-wide
-- per-day and per-hour figures (the daily trend, the forecast's days, the usage heatmap) read
-- instead of one row per GPU and day or hour. A group is named by `gkey`, its six values each
-- written as `<length>:<value>` (`-` for none), so two groups never share a key.
-- `group_days` leaves out the days a change of owner splits (the queries read those GPU-days
-- from their hours), so each GPU-day counts in one group and `gpus` adds up across groups.
-- `group_hours` holds every hour of physical GPUs under the owner of that hour.
-- `group_dirty` lists the days whose group rows may be out of date: the queries read those days
-- from the per-GPU rows, and the server's refresher rebuilds their group rows. A re-roll of day
-- rows marks its days; the triggers below mark the days a change of a GPU's group attributes,
-- its rate, its owner history or a removed day row touches. Keep in step with the other
-- backend's file of this name.
CREATE TABLE fleet_groups (
    id INTEGER PRIMARY KEY,
    gkey TEXT NOT NULL UNIQUE,
    team TEXT NOT NULL,
    env TEXT NOT NULL,
    cloud TEXT,
    cluster TEXT,
    model TEXT NOT NULL,
    vendor TEXT
);

CREATE TABLE group_days (
    day BIGINT NOT NULL,
    grp BIGINT NOT NULL,
    gpus BIGINT NOT NULL,
    present BIGINT NOT NULL,
    known BIGINT NOT NULL,
    idle BIGINT NOT NULL,
    alloc BIGINT NOT NULL,
    act DOUBLE PRECISION NOT NULL,
    cost DOUBLE PRECISION NOT NULL,
    unpriced BIGINT NOT NULL,
    PRIMARY KEY (day, grp)
) WITHOUT ROWID;

CREATE TABLE group_hours (
    hour BIGINT NOT NULL,
    grp BIGINT NOT NULL,
    present BIGINT NOT NULL,
    known BIGINT NOT NULL,
    idle BIGINT NOT NULL,
    alloc BIGINT NOT NULL,
    act DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (hour, grp)
) WITHOUT ROWID;

CREATE TABLE group_dirty (
    day BIGINT NOT NULL PRIMARY KEY
) WITHOUT ROWID;

INSERT INTO group_dirty (day) SELECT DISTINCT day FROM gpu_days;

-- The triggers skip days already listed rather than `INSERT OR IGNORE`: an upsert that fires
-- a trigger imposes its own conflict handling on the trigger's statements.
CREATE TRIGGER group_dirty_gpu AFTER UPDATE OF cloud, cluster, model, vendor, usd_per_hour,
    mig_parent_uuid ON gpus
WHEN OLD.cloud IS NOT NEW.cloud OR OLD.cluster IS NOT NEW.cluster OR OLD.model IS NOT NEW.model
    OR OLD.vendor IS NOT NEW.vendor OR OLD.usd_per_hour IS NOT NEW.usd_per_hour
    OR OLD.mig_parent_uuid IS NOT NEW.mig_parent_uuid
BEGIN
    INSERT INTO group_dirty (day) SELECT day FROM gpu_days WHERE gpu_id = NEW.id
    AND NOT EXISTS (SELECT 1 FROM group_dirty x WHERE x.day = gpu_days.day);
END;

CREATE TRIGGER group_dirty_gpu_gone AFTER DELETE ON gpus
BEGIN
    INSERT INTO group_dirty (day) SELECT day FROM gpu_days WHERE gpu_id = OLD.id
    AND NOT EXISTS (SELECT 1 FROM group_dirty x WHERE x.day = gpu_days.day);
END;

CREATE TRIGGER group_dirty_owner_new AFTER INSERT ON gpu_owners
BEGIN
    INSERT INTO group_dirty (day) SELECT day FROM gpu_days
    WHERE gpu_id = NEW.gpu_id AND day >= NEW.from_ts - NEW.from_ts % 86400 AND day < NEW.to_ts
    AND NOT EXISTS (SELECT 1 FROM group_dirty x WHERE x.day = gpu_days.day);
END;

CREATE TRIGGER group_dirty_owner_gone AFTER DELETE ON gpu_owners
BEGIN
    INSERT INTO group_dirty (day) SELECT day FROM gpu_days
    WHERE gpu_id = OLD.gpu_id AND day >= OLD.from_ts - OLD.from_ts % 86400 AND day < OLD.to_ts
    AND NOT EXISTS (SELECT 1 FROM group_dirty x WHERE x.day = gpu_days.day);
END;

-- A period whose bounds moved changes the days between its old and new bounds; one whose team
-- or environment changed, all of its days.
CREATE TRIGGER group_dirty_owner_moved AFTER UPDATE ON gpu_owners
BEGIN
    INSERT INTO group_dirty (day) SELECT day FROM gpu_days WHERE gpu_id = NEW.gpu_id
    AND ((day >= MIN(OLD.from_ts, NEW.from_ts) - MIN(OLD.from_ts, NEW.from_ts) % 86400
          AND day < MAX(OLD.from_ts, NEW.from_ts))
      OR (day >= MIN(OLD.to_ts, NEW.to_ts) - MIN(OLD.to_ts, NEW.to_ts) % 86400
          AND day < MAX(OLD.to_ts, NEW.to_ts))
      OR ((OLD.team <> NEW.team OR OLD.env <> NEW.env OR OLD.gpu_id <> NEW.gpu_id)
          AND day >= NEW.from_ts - NEW.from_ts % 86400 AND day < NEW.to_ts))
    AND NOT EXISTS (SELECT 1 FROM group_dirty x WHERE x.day = gpu_days.day);
    INSERT INTO group_dirty (day) SELECT day FROM gpu_days
    WHERE OLD.gpu_id <> NEW.gpu_id AND gpu_id = OLD.gpu_id
    AND day >= OLD.from_ts - OLD.from_ts % 86400 AND day < OLD.to_ts
    AND NOT EXISTS (SELECT 1 FROM group_dirty x WHERE x.day = gpu_days.day);
END;

CREATE TRIGGER group_dirty_day_gone AFTER DELETE ON gpu_days
BEGIN
    INSERT INTO group_dirty (day) SELECT OLD.day
    WHERE NOT EXISTS (SELECT 1 FROM group_dirty x WHERE x.day = OLD.day);
END;
