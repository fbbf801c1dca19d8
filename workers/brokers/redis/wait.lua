-- include: _shared.lua
-- A busy record must wait: it leaves the lane and becomes due again in delay ms (its
-- messages stay at the head of its list, so nothing behind it overtakes it). Its shard's
-- other records are not held up.
-- KEYS: SHARD_KEYS of the shard (see _shared.lua), then the COMMON_KEYS (depth, held, counters,
-- backlog).
-- ARGV: lease value, record key, delay ms, why (JSON, for status), delivery counts
-- ('uncount': one less each, the attempt was not the message's fault; 'forget': none, so a
-- batch is taken together again; 'keep'), then the messages whose counts change.
-- Returns 0 when the lease is not ours (nothing done), else 1.
local K = shard_keys(0)
local lease, key, delay, why, counts = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
if redis.call('GET', K.lease) ~= lease then return 0 end
for i = 6, #ARGV do
  local digest = redis.sha1hex(ARGV[i])
  if counts == 'uncount' then
    redis.call('HINCRBY', K.deliveries, digest, -1)
  elseif counts == 'forget' then
    redis.call('HDEL', K.deliveries, digest)
  end
end
redis.call('HDEL', K.busy, key)
if redis.call('HEXISTS', K.held, key) == 0 then
  redis.call('ZADD', K.ready, now_ms() + math.max(0, delay), key)
  redis.call('HSET', K.waits, key, why)
end
return 1
