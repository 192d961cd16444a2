-- The accelerator's vendor (`nvidia`, `amd`, `intel`, `other`), derived from its identity's
-- prefix (`gpuledger_model::accel`) or, for a placeholder, from the `vendor` label its count
-- source gave; NULL when unknown. Written with every GPU record; kept as a column so pages can
-- filter and group by it. Keep in step with the other backend's file of this name.
ALTER TABLE gpus ADD COLUMN vendor TEXT;
UPDATE gpus SET vendor = 'nvidia' WHERE uuid LIKE 'GPU-%' OR uuid LIKE 'MIG-%';
UPDATE gpus SET vendor = 'amd' WHERE uuid LIKE 'AMD-%';
UPDATE gpus SET vendor = 'intel' WHERE uuid LIKE 'HL-%';
UPDATE gpus SET vendor = 'other' WHERE uuid LIKE 'ACC-%';
CREATE INDEX gpus_vendor ON gpus (vendor);
