-- include: _shared.lua
-- The owner's lanes hold none of these busy records (a lane gave up on one while the broker
-- could not be reached, or a reply that handed one out was lost): those taken at least
-- min age ms ago become due again, each at its place in its list.
-- KEYS: SHARD_KEYS of the shard (see _shared.lua), then the COMMON_KEYS (depth, held,
-- counters, backlog).
-- ARGV: lease value, min age ms, then the record keys.
-- Returns how many were made due again (-1 when the lease is not ours).
local K = shard_keys(0)
if redis.call('GET', K.lease) ~= ARGV[1] then return -1 end
local now, min_age = now_ms(), tonumber(ARGV[2])
local reclaimed = 0
for i = 3, #ARGV do
  local key = ARGV[i]
  local taken = redis.call('HGET', K.busy, key)
  if taken and now - tonumber(taken) >= min_age then
    redis.call('HDEL', K.busy, key)
    if redis.call('HEXISTS', K.held, key) == 0 and redis.call('LLEN', K.rec_prefix .. key) > 0 then
      redis.call('ZADD', K.ready, 0, key)
    end
    reclaimed = reclaimed + 1
  end
end
if reclaimed > 0 then redis.call('HINCRBY', K.counters, 'reclaimed', reclaimed) end
return reclaimed
