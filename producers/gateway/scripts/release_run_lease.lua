-- Give a run's lease up, only if it is still the run's. KEYS = (lease); ARGV = (value).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
