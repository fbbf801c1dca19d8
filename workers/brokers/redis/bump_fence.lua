-- Raise a shard's fencing counter to at least ARGV[1] (after Redis lost data).
-- KEYS: the fence counter. Returns the counter as it was.
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return current
