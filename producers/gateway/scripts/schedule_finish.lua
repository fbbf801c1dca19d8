-- A run ended, if it still holds its lease (else it was taken over: nothing is written).
-- KEYS = (state hash, run lease, log stream); ARGV = (lease value, outcome ('ok' or
-- 'failed'), error, events sent, of them duplicates, tick, job, token, log max length).
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
