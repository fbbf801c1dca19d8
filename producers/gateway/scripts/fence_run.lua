-- Prepended to accept.lua for a scheduled run's events (the accept script, fenced):
-- nothing is accepted unless the run still holds its job's lease (a scheduler that
-- paused past its lease, or was taken over, can send nothing more). KEYS and ARGV as
-- accept.lua, then KEYS[6] = the job's lease, ARGV[9] = the run's lease value.
if redis.call('GET', KEYS[6]) ~= ARGV[9] then return {'fenced', ''} end
