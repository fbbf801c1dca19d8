-- include: _seen.lua
-- An event's told outcome, and whether it was accepted (its id is remembered, in either
-- layout, or it was told).
-- KEYS = (told outcome, its 0.1.x dedupe mark, the prefix of its source's remembered ids);
-- ARGV = (its id's slot, its id's field, the source's retention ms).
-- Returns {the told outcome or '', 1 if accepted else 0}.
local told = redis.call('GET', KEYS[1])
if told then return {told, 1} end
if seen_find(KEYS[3], ARGV[1], ARGV[2], tonumber(ARGV[3]), now_ms()) then return {'', 1} end
return {'', redis.call('EXISTS', KEYS[2])}
