-- Today's per-GPU counts are kept in memory between requests (`live.rs`): each request reads
-- again only the GPUs whose rows of today changed since, found by the transaction that wrote
-- each day row and hour row (`xmin`). What that cannot see, a removed row, a GPU's new or
-- changed attributes, a new or changed owner period, bumps the generation `meta.live_gen`
-- below, and every kept answer is read again in full. Pushes rewrite GPU rows for `last_seen`
-- and the like; only the columns today's counts read bump it. Keep in step with the other
-- backend's file of this name.
CREATE FUNCTION live_bump() RETURNS void LANGUAGE sql AS $$
    INSERT INTO meta (key, value) VALUES ('live_gen', '1')
    ON CONFLICT (key) DO UPDATE SET value = CAST(CAST(meta.value AS BIGINT) + 1 AS TEXT)
$$;

CREATE FUNCTION live_gone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM gone) THEN
        PERFORM live_bump();
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION live_gpus_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM was w JOIN now n ON n.id = w.id
        WHERE n.uuid IS DISTINCT FROM w.uuid OR n.host IS DISTINCT FROM w.host
        OR n.memory_mib IS DISTINCT FROM w.memory_mib OR n.cloud IS DISTINCT FROM w.cloud
        OR n.cluster IS DISTINCT FROM w.cluster OR n.model IS DISTINCT FROM w.model
        OR n.vendor IS DISTINCT FROM w.vendor OR n.usd_per_hour IS DISTINCT FROM w.usd_per_hour
        OR n.mig_parent_uuid IS DISTINCT FROM w.mig_parent_uuid) THEN
        PERFORM live_bump();
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER live_gpus_new AFTER INSERT ON gpus REFERENCING NEW TABLE AS gone
FOR EACH STATEMENT EXECUTE FUNCTION live_gone();
CREATE TRIGGER live_gpus_gone AFTER DELETE ON gpus REFERENCING OLD TABLE AS gone
FOR EACH STATEMENT EXECUTE FUNCTION live_gone();
CREATE TRIGGER live_gpus_changed AFTER UPDATE ON gpus REFERENCING OLD TABLE AS was NEW TABLE AS now
FOR EACH STATEMENT EXECUTE FUNCTION live_gpus_changed();

CREATE TRIGGER live_owners_new AFTER INSERT ON gpu_owners REFERENCING NEW TABLE AS gone
FOR EACH STATEMENT EXECUTE FUNCTION live_gone();
CREATE TRIGGER live_owners_changed AFTER UPDATE ON gpu_owners REFERENCING NEW TABLE AS gone
FOR EACH STATEMENT EXECUTE FUNCTION live_gone();
CREATE TRIGGER live_owners_gone AFTER DELETE ON gpu_owners REFERENCING OLD TABLE AS gone
FOR EACH STATEMENT EXECUTE FUNCTION live_gone();

CREATE TRIGGER live_days_gone AFTER DELETE ON gpu_days REFERENCING OLD TABLE AS gone
FOR EACH STATEMENT EXECUTE FUNCTION live_gone();
CREATE TRIGGER live_hours_gone AFTER DELETE ON gpu_hours REFERENCING OLD TABLE AS gone
FOR EACH STATEMENT EXECUTE FUNCTION live_gone();
