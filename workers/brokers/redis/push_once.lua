-- Queue an operator's message (a dead letter's retry, a release) once per marker, and ring
-- the shard. It enters the shard queue like any event; admission (see _shared.lua) puts a
-- retry of the dead letter that holds its record first in that record's list.
-- KEYS: marker, shard queue. ARGV: message, marker ttl ms, doorbell channel, shard.
-- Returns 1 when queued, 0 when the marker was used before.
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[2]) == false then return 0 end
redis.call('LPUSH', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
