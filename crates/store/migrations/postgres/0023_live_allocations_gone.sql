-- The used-by shares of the hours ahead of the clock are kept in memory between requests too
-- (`live.rs`): each request reads again the GPUs whose hours there or whose allocations were
-- written since. A removed allocation leaves no row to find, so it bumps the generation
-- (`live_bump`, migration 22) and every kept answer is read again in full. Allocations are
-- removed when a pool's placeholder is placed on a real GPU, and with their GPU. Keep in step
-- with the other backend's file of this name.
CREATE TRIGGER live_allocations_gone AFTER DELETE ON allocations REFERENCING OLD TABLE AS gone
FOR EACH STATEMENT EXECUTE FUNCTION live_gone();
