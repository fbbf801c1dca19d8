-- Extend the leases still held. KEYS: the leases. ARGV: ttl ms, then each lease's value.
-- Returns 1 per lease renewed, 0 per lease lost.
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
