"""Every Lua script keylane runs in Redis, named for what it does.

Each runs atomically: that is the whole point of keeping every step that must not be
split (accept = dedupe + enqueue; take, ack, acquire, park, unhold) in one script. The
receiver's gateway (:mod:`keylane.producers.gateway`) runs the first two, the lanes'
gateway (:mod:`keylane.workers.gateway`) the rest. Key names come from
:mod:`keylane.routing.keys`.
"""

# -- the receiver ------------------------------------------------------------------------

# Dedupe on the sender's event id and push to the shard queue, or neither (invariant 1):
# KEYS = (dedupe mark, queue, counters); ARGV = (body hash, message, answer, retention ms,
# high-water mark, doorbell channel, shard, keyless flag).
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
local depth = redis.call('LLEN', KEYS[2])
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

# -- the lanes ---------------------------------------------------------------------------


ACQUIRE_LEASE = """
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
local restored = 0
while true do
  local m = redis.call('LMOVE', KEYS[3], KEYS[4], 'LEFT', 'RIGHT')
  if not m then break end
  restored = restored + 1
end
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[4], '*', 'event', 'acquired',
  'shard', ARGV[3], 'worker', ARGV[1], 'token', token, 'restored', restored,
  'expired', previous)
return {1, value, restored}
"""

RENEW_LEASES = """
local out = {}
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[i + 1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""

RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'event', ARGV[3],
  'shard', ARGV[2], 'worker', ARGV[5], 'token', ARGV[6], 'restored', 0, 'expired', '')
return 1
"""

# KEYS: (lease, inflight, queue, deliveries) per candidate shard, then the held-keys hash.
# A message is counted in ``deliveries`` (by the SHA-1 of its bytes, which a restore
# keeps) each time it is handed to a lane, so poison is seen even when the lane dies.
# A batch: a first delivery whose message carries the keylane_batch header (the source's
# limit and its record, see message.BATCH_HEADER) also takes the messages right behind it
# in the queue that carry the same header and were never handed out, up to the limit,
# and only while no key is held. They sit in flight behind it, in order, each counted.
TAKE_MESSAGE = """
local held_keys = redis.call('HLEN', KEYS[#KEYS])
for i = 1, #ARGV do
  local lease, inflight, queue, deliveries = KEYS[4*i-3], KEYS[4*i-2], KEYS[4*i-1], KEYS[4*i]
  if redis.call('GET', lease) == ARGV[i] then
    local resumed = 1
    local m = redis.call('LINDEX', inflight, -1)
    if not m then
      resumed = 0
      m = redis.call('LMOVE', queue, inflight, 'RIGHT', 'LEFT')
    end
    if m then
      local n = redis.call('HINCRBY', deliveries, redis.sha1hex(m), 1)
      local batch = {}
      local limit, record = string.match(m, '"keylane_batch": "(%d+):(%x+)"')
      if limit and resumed == 0 and n == 1 and held_keys == 0 then
        local tag = '"keylane_batch": "' .. limit .. ':' .. record .. '"'
        limit = tonumber(limit)
        while #batch + 1 < limit do
          local nxt = redis.call('LINDEX', queue, -1)
          if not nxt or not string.find(nxt, tag, 1, true) then break end
          local digest = redis.sha1hex(nxt)
          if redis.call('HEXISTS', deliveries, digest) == 1 then break end
          redis.call('LMOVE', queue, inflight, 'RIGHT', 'LEFT')
          redis.call('HSET', deliveries, digest, 1)
          batch[#batch + 1] = nxt
        end
      end
      return {i, m, resumed, held_keys, n, batch}
    end
  end
end
return nil
"""

# Put a batch that must wait back at the head of its queue, in order, its delivery counts
# dropped (the next take is their first delivery again, so they are taken together), its
# retry notes kept. Only what is in flight under the lease moves.
# KEYS = (lease, inflight, queue, deliveries); ARGV = (lease value, the messages in order).
REQUEUE_BATCH = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
for i = #ARGV, 2, -1 do
  if redis.call('LREM', KEYS[2], 1, ARGV[i]) == 1 then
    redis.call('RPUSH', KEYS[3], ARGV[i])
    redis.call('HDEL', KEYS[4], redis.sha1hex(ARGV[i]))
  end
end
return 1
"""

# Park a held key's message (in arrival order), or, when the message is the operator's
# retry of the very dead letter that holds the key, release the key: its parked messages
# go back to the head of the queue, to run right after this one.
PARK_MESSAGE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 'lost' end
local holder = redis.call('HGET', KEYS[3], ARGV[3])
if not holder then return 'free' end
if ARGV[4] ~= '' and holder == ARGV[4] then
  redis.call('HDEL', KEYS[3], ARGV[3])
  local parked = redis.call('LRANGE', KEYS[4], 0, -1)
  for i = #parked, 1, -1 do redis.call('RPUSH', KEYS[5], parked[i]) end
  redis.call('DEL', KEYS[4])
  return 'released'
end
redis.call('RPUSH', KEYS[4], ARGV[2])
redis.call('LREM', KEYS[2], 1, ARGV[2])
local digest = redis.sha1hex(ARGV[2])
redis.call('HDEL', KEYS[6], digest, digest .. ':error', digest .. ':retries',
  digest .. ':since', digest .. ':write')
redis.call('HINCRBY', KEYS[7], 'parked', 1)
return 'parked'
"""

# The unhold control message: the dead letter that held the key was resolved or discarded,
# so the key's parked messages go back to the head of the queue, in order.
UNHOLD_KEY = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local released = 0
if redis.call('HGET', KEYS[3], ARGV[3]) == ARGV[4] then
  redis.call('HDEL', KEYS[3], ARGV[3])
  local parked = redis.call('LRANGE', KEYS[4], 0, -1)
  for i = #parked, 1, -1 do redis.call('RPUSH', KEYS[5], parked[i]) end
  redis.call('DEL', KEYS[4])
  released = #parked
end
redis.call('LREM', KEYS[2], 1, ARGV[2])
local digest = redis.sha1hex(ARGV[2])
redis.call('HDEL', KEYS[6], digest, digest .. ':error', digest .. ':retries',
  digest .. ':since', digest .. ':write')
return released
"""

# Queue an operator's message once per marker: at the head (RPUSH) or the tail (LPUSH).
PUSH_ONCE = """
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[3]) == false then return 0 end
if ARGV[2] == 'head' then
  redis.call('RPUSH', KEYS[2], ARGV[1])
else
  redis.call('LPUSH', KEYS[2], ARGV[1])
end
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
"""

# Acknowledge, and count in the same step: outcome, conflicts and attempts (counters),
# accepted-to-done latency (histogram bucket, sum, count) and the shard's drain count.
ACK_MESSAGE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('LREM', KEYS[2], 1, ARGV[2])
local digest = redis.sha1hex(ARGV[2])
redis.call('HDEL', KEYS[3], digest, digest .. ':error', digest .. ':retries',
  digest .. ':since', digest .. ':write')
redis.call('HINCRBY', KEYS[6], ARGV[8], 1)
if ARGV[3] == '' then return 1 end
redis.call('HINCRBY', KEYS[4], ARGV[3], 1)
if tonumber(ARGV[4]) > 0 then redis.call('HINCRBY', KEYS[4], 'conflicts', ARGV[4]) end
if tonumber(ARGV[5]) > 0 then redis.call('HINCRBY', KEYS[4], 'attempts', ARGV[5]) end
if ARGV[6] ~= '' then
  redis.call('HINCRBY', KEYS[5], ARGV[6], 1)
  redis.call('HINCRBY', KEYS[5], 'count', 1)
  redis.call('HINCRBYFLOAT', KEYS[5], 'sum', ARGV[7])
end
return 1
"""

# Claim a single-holder key, or renew it when it is already ours, or take it over from
# ARGV[3] (a holder known to be dead): KEYS = (claim); ARGV = (holder, ttl ms, replacing).
# Returns the holder after the call.
CLAIM_OR_RENEW = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] or (ARGV[3] ~= '' and holder == ARGV[3]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return ARGV[1]
end
return holder
"""

# Give a single-holder key up, only if it is still ours.
RELEASE_CLAIM = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

BUMP_FENCE = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return current
"""

# A plain Celery consumer took a shard message: put it back at the head and ring the shard.
GIVE_BACK = """
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"""

# -- destinations: flow control shared by every worker --------------------------------

# May a call to a destination start now? Limits: calls in flight (a sorted set of slots
# whose scores are expiry times, so a slot of a worker killed mid-call frees itself), calls
# per second (a token bucket holding at most one token) and a pause after Retry-After.
# A slot already held (the same message, resumed after a crash) is kept. Time is Redis's
# own clock, so every worker measures against the same one. The bucket fills at the
# configured rate, or at the adapted one (``adapted``, kept by FLOW_RELEASE after a 429)
# when that is lower; a destination that does not adapt drops it.
# KEYS = (calls, bucket, counters, destinations set); ARGV = (slot, max in flight (0: none),
# configured rate per s (0: none), slot ttl ms, destination name, adaptive (1/0)).
# Returns {1, 0, 'ok'} or {0, wait ms, why}.
FLOW_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max, rate = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('SADD', KEYS[4], ARGV[5])
redis.call('HSET', KEYS[2], 'max', ARGV[2], 'rate', ARGV[3])
local adapted = tonumber(redis.call('HGET', KEYS[2], 'adapted') or '0')
if ARGV[6] ~= '1' and adapted > 0 then
  redis.call('HDEL', KEYS[2], 'adapted', 'cut_rate')
elseif adapted > 0 and (rate == 0 or adapted < rate) then
  rate = adapted
end
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

# A call ended: free its slot, count its outcome, (after a Retry-After) pause the
# destination for every worker, and adapt its rate (AIMD, shared by every worker):
# * a throttled call (429, or a Retry-After pause) lowers the rate to 0.9 x the calls the
#   destination admitted in the last second (what it takes), at most 0.9 x the rate in
#   force (half of it when nothing was admitted), never below 0.1/s. Only a call started
#   after the last cut cuts again: the calls in flight when the destination began to
#   refuse all answer for the same excess.
# * each call that succeeds raises the adapted rate a little: by max(0.05, 1 % of the rate
#   of the last cut) calls/s over a second of successful calls, so a 10 % cut is made up in
#   about 10 s; past the configured rate (or, with none, twice the rate of the last cut)
#   the destination runs at its configured limits again.
# KEYS = (calls, bucket, counters, admitted: a sorted set of the last second's successful
# calls); ARGV = (slot, outcome counter, pause ms (0: none), throttled (1/0), slot ttl ms,
# adaptive (1/0)). Returns the new rate (text) when it was cut, else ''.
FLOW_RELEASE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0')
local started = now
if expiry > 0 then started = expiry - tonumber(ARGV[5]) end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HINCRBY', KEYS[3], ARGV[2], 1)
local pause = tonumber(ARGV[3])
if pause > 0 then
  local paused = tonumber(redis.call('HGET', KEYS[2], 'paused') or '0')
  if now + pause > paused then redis.call('HSET', KEYS[2], 'paused', now + pause) end
end
if ARGV[6] ~= '1' then return '' end
local configured = tonumber(redis.call('HGET', KEYS[2], 'rate') or '0')
local adapted = tonumber(redis.call('HGET', KEYS[2], 'adapted') or '0')
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - 1000)
if ARGV[4] == '1' then
  if started < tonumber(redis.call('HGET', KEYS[2], 'cut_at') or '0') then return '' end
  local current = configured
  if adapted > 0 and (current == 0 or adapted < current) then current = adapted end
  local admitted = redis.call('ZCARD', KEYS[4])
  local new = 1
  if admitted > 0 then
    new = 0.9 * admitted
    if current > 0 then new = math.min(new, 0.9 * current) end
  elseif current > 0 then
    new = 0.5 * current
  end
  new = math.max(0.1, new)
  redis.call('HSET', KEYS[2], 'adapted', tostring(new), 'cut_rate', tostring(new), 'cut_at', now)
  redis.call('HINCRBY', KEYS[3], 'rate_cuts', 1)
  return tostring(new)
end
if ARGV[2] == 'done' then
  redis.call('ZADD', KEYS[4], now, ARGV[1] .. '@' .. now)
  redis.call('PEXPIRE', KEYS[4], 2000)
  if adapted > 0 then
    local cut_rate = tonumber(redis.call('HGET', KEYS[2], 'cut_rate') or tostring(adapted))
    adapted = adapted + math.max(0.05, 0.01 * cut_rate) / adapted
    local ceiling = configured
    if ceiling == 0 then ceiling = 2 * cut_rate end
    if adapted >= ceiling then
      redis.call('HDEL', KEYS[2], 'adapted', 'cut_rate')
    else
      redis.call('HSET', KEYS[2], 'adapted', tostring(adapted))
    end
  end
end
return ''
"""

# One more failed call of a shard's in-flight message: count it and keep the time of the
# first failure (both dropped when the message is acknowledged). Returns {retries, since ms}.
NOTE_RETRY = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local retries = redis.call('HINCRBY', KEYS[1], ARGV[1] .. ':retries', 1)
redis.call('HSETNX', KEYS[1], ARGV[1] .. ':since', now)
return {retries, now - tonumber(redis.call('HGET', KEYS[1], ARGV[1] .. ':since'))}
"""
