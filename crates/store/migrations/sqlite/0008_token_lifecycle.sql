-- Token lifecycle: an optional expiry, revocation (the row stays, so `token list` shows who
-- had access and until when), and when the token was last accepted (kept to the minute).
-- Keep in step with the other backend's file of this name.
ALTER TABLE tokens ADD COLUMN expires_at BIGINT;
ALTER TABLE tokens ADD COLUMN revoked_at BIGINT;
ALTER TABLE tokens ADD COLUMN last_used_at BIGINT;
