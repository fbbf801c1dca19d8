-- Give a single-holder key up, only if it is still ours. KEYS: the claim. ARGV: holder.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
