-- Give the SQLite store's single-writer key up (graceful stop), only if it is still ours.
-- KEYS: the claim, the last holder. ARGV: holder.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
