-- Give a lease up, only if still ours, and log it.
-- KEYS: lease, lease log, last owner. ARGV: lease value, shard, why, log max length,
-- worker id, token. Returns 1 when released.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'event', ARGV[3],
  'shard', ARGV[2], 'worker', ARGV[5], 'token', ARGV[6], 'restored', 0, 'expired', '')
return 1
