-- A GPU's day rows newest first: the waste findings ask each GPU for its last busy and last
-- measured day, which this answers from the few latest rows instead of a scan of every day of
-- every GPU. Keep in step with the other backend's file of this name.
CREATE INDEX gpu_days_gpu ON gpu_days (gpu_id, day);
