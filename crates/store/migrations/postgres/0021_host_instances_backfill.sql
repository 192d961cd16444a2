-- Every cloud instance a stored GPU names (`labels.instance_id`) gets its `host_instances` row:
-- the host of the first GPU (by first sighting, then UUID) that named it, through the host
-- aliases. Ingest then finds an instance by that table alone; before this, an instance not
-- in it was looked for in every GPU's labels (a scan of `gpus` per new instance, so
-- registering a cloud fleet took time growing with the square of its size), for hosts stored
-- before migration 10 began recording instances. IDs are kept trimmed and in lower case, as
-- ingest writes them. Keep in step with the other backend's file of this name.
INSERT INTO host_instances (instance_id, host, source, observed_at)
SELECT DISTINCT ON (i.instance_id) i.instance_id, COALESCE(a.host, i.host), i.source,
    i.first_seen
FROM (
    SELECT LOWER(BTRIM(CAST(labels AS JSONB) ->> 'instance_id')) AS instance_id, host, source,
        first_seen, uuid
    FROM gpus
    WHERE host IS NOT NULL AND mig_parent_uuid IS NULL
        AND jsonb_typeof(CAST(labels AS JSONB) -> 'instance_id') = 'string'
) i
LEFT JOIN host_aliases a ON a.alias = i.host
WHERE i.instance_id <> ''
ORDER BY i.instance_id, i.first_seen, i.uuid
ON CONFLICT (instance_id) DO NOTHING;
