-- Notifications: what each finding last told its audience (one row per finding and audience
-- while it is open, kept when it clears so a "resolved" goes out once), and every delivery
-- attempted, with its outcome. Keep in step with the other backend's file of this name.
CREATE TABLE notify_state (
    key TEXT NOT NULL,
    audience TEXT NOT NULL,
    rule TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    subject TEXT NOT NULL,
    opened_at BIGINT NOT NULL,
    sent_at BIGINT,
    resolved_at BIGINT,
    PRIMARY KEY (key, audience)
);
CREATE TABLE notify_log (
    id INTEGER PRIMARY KEY,
    at BIGINT NOT NULL,
    key TEXT NOT NULL,
    event TEXT NOT NULL,
    audience TEXT NOT NULL,
    channel TEXT NOT NULL,
    recipient TEXT NOT NULL,
    subject TEXT NOT NULL,
    outcome TEXT NOT NULL,
    attempts BIGINT NOT NULL,
    error TEXT
);
CREATE INDEX notify_log_at ON notify_log (at);
CREATE INDEX notify_log_recipient ON notify_log (recipient, at);
