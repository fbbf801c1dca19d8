"""The receiver's Lua scripts and the destinations' flow control, named for what they do.

Each runs atomically: that is the whole point of keeping every step that must not be
split (accept = dedupe + enqueue) in one script. The receiver's gateway
(:mod:`keylane.producers.gateway`) runs the first two, the lanes' flow control
(:mod:`keylane.workers.flow`) the last two. The lanes' own scripts (take, finish, wait,
acquire, ...) live beside their broker, in ``workers/brokers/redis/*.lua``. Key names come
from :mod:`keylane.routing.redis_keys`.
"""

# -- the receiver ------------------------------------------------------------------------

# Dedupe on the sender's event id and push to the shard queue, or neither (invariant 1):
# KEYS = (dedupe mark, queue, counters, depth); ARGV = (body hash, message, answer,
# retention ms, high-water mark, doorbell channel, shard, keyless flag). The shard's depth
# is its queue and what its owner admitted into records' lists (held records apart).
ACCEPT_EVENT = """
local seen = redis.call('GET', KEYS[1])
if seen then
  local sep = string.find(seen, '\\n', 1, true)
  if string.sub(seen, 1, sep - 1) == ARGV[1] then
    redis.call('HINCRBY', KEYS[3], 'duplicate_deliveries', 1)
    return {'duplicate', string.sub(seen, sep + 1)}
  end
  redis.call('HINCRBY', KEYS[3], 'reused_ids', 1)
  return {'reused', string.sub(seen, sep + 1)}
end
local depth = redis.call('LLEN', KEYS[2]) + tonumber(redis.call('HGET', KEYS[4], ARGV[7]) or '0')
if depth >= tonumber(ARGV[5]) then
  redis.call('HINCRBY', KEYS[3], 'refused_full', 1)
  return {'full', tostring(depth)}
end
redis.call('LPUSH', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1] .. '\\n' .. ARGV[3], 'PX', ARGV[4])
redis.call('PUBLISH', ARGV[6], ARGV[7])
redis.call('HINCRBY', KEYS[3], 'accepted', 1)
if ARGV[8] == '1' then redis.call('HINCRBY', KEYS[3], 'keyless', 1) end
return {'accepted', ARGV[3]}
"""

# Queue one review message per distinct body sent under a reused event id.
RECORD_ID_REUSE = """
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  redis.call('LPUSH', KEYS[2], ARGV[2])
  redis.call('PUBLISH', ARGV[3], ARGV[4])
  return 1
end
return 0
"""

# -- destinations: flow control shared by every worker --------------------------------

# May a call to a destination start now? Limits: calls in flight (a sorted set of slots
# whose scores are expiry times, so a slot of a worker killed mid-call frees itself), calls
# per second (a token bucket holding at most one token) and a pause after Retry-After.
# A slot already held (the same message, resumed after a crash) is kept. Time is Redis's
# own clock, so every worker measures against the same one.
# KEYS = (calls, bucket, counters, destinations set); ARGV = (slot, max in flight (0: none),
# rate per s (0: none), slot ttl ms, destination name).
# Returns {1, 0, 'ok'} or {0, wait ms, why}.
FLOW_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max, rate = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('SADD', KEYS[4], ARGV[5])
redis.call('HSET', KEYS[2], 'max', ARGV[2], 'rate', ARGV[3])
local paused = tonumber(redis.call('HGET', KEYS[2], 'paused') or '0')
if paused > now then
  redis.call('HINCRBY', KEYS[3], 'waits', 1)
  return {0, paused - now, 'paused'}
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), ARGV[1])
  redis.call('HINCRBY', KEYS[3], 'calls', 1)
  return {1, 0, 'ok'}
end
if max > 0 and redis.call('ZCARD', KEYS[1]) >= max then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  redis.call('HINCRBY', KEYS[3], 'waits', 1)
  return {0, math.max(1, math.min(1000, tonumber(first[2]) - now)), 'in_flight'}
end
if rate > 0 then
  local tokens = tonumber(redis.call('HGET', KEYS[2], 'tokens') or '1')
  local ts = tonumber(redis.call('HGET', KEYS[2], 'ts') or tostring(now))
  tokens = math.min(1, tokens + math.max(0, now - ts) * rate / 1000)
  if tokens < 1 then
    redis.call('HSET', KEYS[2], 'tokens', tostring(tokens), 'ts', now)
    redis.call('HINCRBY', KEYS[3], 'waits', 1)
    return {0, math.max(1, math.ceil((1 - tokens) * 1000 / rate)), 'rate'}
  end
  redis.call('HSET', KEYS[2], 'tokens', tostring(tokens - 1), 'ts', now)
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), ARGV[1])
redis.call('HINCRBY', KEYS[3], 'calls', 1)
return {1, 0, 'ok'}
"""

# A call ended: free its slot, count its outcome, and (after a Retry-After) pause the
# destination for every worker. KEYS = (calls, bucket, counters);
# ARGV = (slot, outcome counter, pause ms (0: none)).
FLOW_RELEASE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HINCRBY', KEYS[3], ARGV[2], 1)
local pause = tonumber(ARGV[3])
if pause > 0 then
  local t = redis.call('TIME')
  local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + pause
  local paused = tonumber(redis.call('HGET', KEYS[2], 'paused') or '0')
  if until_ms > paused then redis.call('HSET', KEYS[2], 'paused', until_ms) end
end
return 1
"""
