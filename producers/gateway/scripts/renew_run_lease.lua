-- Extend a run's lease, only while it is still the run's. KEYS = (lease); ARGV = (value, ttl ms).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
