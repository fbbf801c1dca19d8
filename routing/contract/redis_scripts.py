"""The receiver's and the scheduler's Lua scripts and the destinations' flow control, named
for what they do.

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

# The accept script of a scheduled run's events, fenced: nothing is accepted unless the
# run still holds its job's lease (a scheduler that paused past its lease, or was taken
# over, can send nothing more). KEYS and ARGV as ACCEPT_EVENT, then KEYS[5] = the job's
# lease, ARGV[9] = the run's lease value.
ACCEPT_FENCED = (
    """
if redis.call('GET', KEYS[5]) ~= ARGV[9] then return {'fenced', ''} end
"""
    + ACCEPT_EVENT
)

# Queue one review message per distinct body sent under a reused event id.
RECORD_ID_REUSE = """
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  redis.call('LPUSH', KEYS[2], ARGV[2])
  redis.call('PUBLISH', ARGV[3], ARGV[4])
  return 1
end
return 0
"""

# -- scheduled jobs ----------------------------------------------------------------------

# One step of one job, by any scheduler process, all of it atomic (two schedulers never
# both start a run, nor both count one tick). KEYS = (state hash, run lease, log stream);
# ARGV = (owner, lease ttl ms, job, due tick ms or '', ticks missed before it, the last
# tick the caller computed from, overlap policy, on_interrupted, log max length, mode).
# In order:
# 1. a run marked in progress whose lease is gone was interrupted (its scheduler died or
#    paused past the lease): logged, and re-run at once by this caller (same tick,
#    attempt + 1) when on_interrupted is 'rerun';
# 2. a due tick newer than the last one: counted (with the ticks missed before it); run
#    by this caller if no run is in progress, else buffered (buffer_one, one at most)
#    or skipped — each counted and logged, none silent;
# 3. no run in progress and a buffered tick: it runs now.
# mode 'manual': a run now (ARGV[4] is its tick), outside the schedule, if none runs.
# Returns {'start', last tick, tick, token, attempt, since} for a run this caller must
# carry out, {'stale', last tick} when the caller's last tick is out of date (nothing
# done), {'none', last tick}, or {'busy', last tick, owner} (manual: a run is going).
SCHEDULE_STEP = """
local state, lease, log = KEYS[1], KEYS[2], KEYS[3]
local owner, job = ARGV[1], ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = redis.call('HGET', state, 'last_tick') or '0'
if ARGV[10] == 'tick' and ARGV[4] ~= '' and last ~= ARGV[6] then return {'stale', last} end
local function note(kind, tick, ...)
  redis.call('XADD', log, 'MAXLEN', '~', ARGV[9], '*', 'event', kind, 'job', job,
    'tick', tick, 'at', now, ...)
end
local function start(tick, attempt)
  local token = redis.call('HINCRBY', state, 'fence', 1)
  redis.call('SET', lease, owner .. '/' .. token, 'PX', ARGV[2])
  local since = redis.call('HGET', state, 'last_success') or ''
  redis.call('HSET', state, 'running', tick, 'token', token, 'attempt', attempt,
    'owner', owner, 'since', since, 'started_at', now)
  redis.call('HINCRBY', state, attempt == 1 and 'runs_started' or 'runs_rerun', 1)
  note('started', tick, 'token', token, 'owner', owner, 'attempt', attempt)
  return {'start', redis.call('HGET', state, 'last_tick') or '0', tick, token, attempt, since}
end
local running = redis.call('HGET', state, 'running') or ''
local result = nil
if running ~= '' and redis.call('EXISTS', lease) == 0 then
  redis.call('HSET', state, 'running', '')
  redis.call('HINCRBY', state, 'runs_interrupted', 1)
  note('interrupted', running, 'token', redis.call('HGET', state, 'token'),
    'owner', redis.call('HGET', state, 'owner'))
  if ARGV[8] == 'rerun' then
    result = start(running, tonumber(redis.call('HGET', state, 'attempt')) + 1)
  else
    redis.call('HSET', state, 'last_outcome', 'interrupted', 'last_run', running,
      'last_finished_at', now)
    running = ''
  end
end
if ARGV[10] == 'manual' then
  if running ~= '' then return {'busy', last, redis.call('HGET', state, 'owner')} end
  return start(ARGV[4], 1)
end
if ARGV[4] ~= '' then
  redis.call('HSET', state, 'last_tick', ARGV[4])
  local missed = tonumber(ARGV[5])
  if missed > 0 then
    redis.call('HINCRBY', state, 'ticks_missed', missed)
    note('missed', ARGV[4], 'count', missed, 'after', last)
  end
  if running ~= '' then
    if ARGV[7] == 'buffer_one' and (redis.call('HGET', state, 'buffered') or '') == '' then
      redis.call('HSET', state, 'buffered', ARGV[4])
      redis.call('HINCRBY', state, 'ticks_buffered', 1)
      note('buffered', ARGV[4], 'behind', running)
    else
      redis.call('HINCRBY', state, 'ticks_skipped', 1)
      note('skipped', ARGV[4], 'behind', running, 'policy', ARGV[7])
    end
  else
    redis.call('HINCRBY', state, 'ticks_started', 1)
    return start(ARGV[4], 1)
  end
end
if result then return result end
if running == '' then
  local buffered = redis.call('HGET', state, 'buffered') or ''
  if buffered ~= '' then
    redis.call('HSET', state, 'buffered', '')
    return start(buffered, 1)
  end
end
return {'none', redis.call('HGET', state, 'last_tick') or '0'}
"""

# A run ended, if it still holds its lease (else it was taken over: nothing is written).
# KEYS = (state hash, run lease, log stream); ARGV = (lease value, outcome ('ok' or
# 'failed'), error, events sent, of them duplicates, tick, job, token, log max length).
SCHEDULE_FINISH = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'running', '', 'last_outcome', ARGV[2], 'last_run', ARGV[6],
  'last_finished_at', now, 'last_error', ARGV[3], 'last_sent', ARGV[4])
if ARGV[2] == 'ok' then
  redis.call('HINCRBY', KEYS[1], 'runs_ok', 1)
  if tonumber(ARGV[6]) > tonumber(redis.call('HGET', KEYS[1], 'last_success') or '0') then
    redis.call('HSET', KEYS[1], 'last_success', ARGV[6])
  end
else
  redis.call('HINCRBY', KEYS[1], 'runs_failed', 1)
end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[9], '*', 'event', 'finished', 'job', ARGV[7],
  'tick', ARGV[6], 'at', now, 'token', ARGV[8], 'outcome', ARGV[2], 'sent', ARGV[4],
  'duplicates', ARGV[5], 'error', ARGV[3])
return 1
"""

# Extend a run's lease, only while it is still the run's. KEYS = (lease); ARGV = (value, ttl ms).
RENEW_RUN_LEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# Give a run's lease up, only if it is still the run's. KEYS = (lease); ARGV = (value).
RELEASE_RUN_LEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
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
