-- One step of one job, by any scheduler process, all of it atomic (two schedulers never
-- both start a run, nor both count one tick). KEYS = (state hash, run lease, log stream);
-- ARGV = (owner, lease ttl ms, job, due tick ms or '', ticks missed before it, the last
-- tick the caller computed from, overlap policy, on_interrupted, log max length, mode).
-- In order:
-- 1. a run marked in progress whose lease is gone was interrupted (its scheduler died or
--    paused past the lease): logged, and re-run at once by this caller (same tick,
--    attempt + 1) when on_interrupted is 'rerun';
-- 2. a due tick newer than the last one: counted (with the ticks missed before it); run
--    by this caller if no run is in progress, else buffered (buffer_one, one at most)
--    or skipped — each counted and logged, none silent;
-- 3. no run in progress and a buffered tick: it runs now.
-- mode 'manual': a run now (ARGV[4] is its tick), outside the schedule, if none runs.
-- Returns {'start', last tick, tick, token, attempt, since} for a run this caller must
-- carry out, {'stale', last tick} when the caller's last tick is out of date (nothing
-- done), {'none', last tick}, or {'busy', last tick, owner} (manual: a run is going).
local state, lease, log = KEYS[1], KEYS[2], KEYS[3]
local owner, job = ARGV[1], ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = redis.call('HGET', state, 'last_tick') or '0'
-- A running scheduler knows this job (``keylane schedules`` says when none has for a while).
if ARGV[10] == 'tick' then redis.call('HSET', state, 'stepped_at', now) end
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
