-- Claim a single-holder key, or renew it when it is already ours, or take it over from
-- ARGV[3] (a holder known to be dead). KEYS: the claim. ARGV: holder, ttl ms, replacing.
-- Returns the holder after the call.
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] or (ARGV[3] ~= '' and holder == ARGV[3]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return ARGV[1]
end
return holder
