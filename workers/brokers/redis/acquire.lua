-- Take a shard's lease if it is free: advance its fencing token, and put every record a
-- previous owner had in flight back among the due ones (each keeps its place in its list).
-- KEYS: lease, fence, busy, ready, lease log, last owner.
-- ARGV: worker id, ttl ms, shard, lease log max length.
-- Returns {1, lease value, records restored} or {0, the holder's lease value, 0}.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('GET', KEYS[1]), 0}
end
local token = redis.call('INCR', KEYS[2])
local value = ARGV[1] .. '/' .. token
-- KEYS[6] holds the last owner until it releases: if it is still set, that owner's
-- lease expired (crash, pause, partition) and this is a takeover.
local previous = redis.call('GET', KEYS[6]) or ''
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
redis.call('SET', KEYS[6], value)
local busy = redis.call('HKEYS', KEYS[3])
for _, key in ipairs(busy) do redis.call('ZADD', KEYS[4], 0, key) end
redis.call('DEL', KEYS[3])
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[4], '*', 'event', 'acquired',
  'shard', ARGV[3], 'worker', ARGV[1], 'token', token, 'restored', #busy,
  'expired', previous)
return {1, value, #busy}
