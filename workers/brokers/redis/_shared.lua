-- Shared by the lane scripts (prepended to each: Redis scripts cannot call each other).
--
-- Key layout of one shard s (every key under the deployment's namespace, $ns:):
--   $ns:keylane.shard.NN   list  the shard's Celery queue: receivers LPUSH, the head is the
--                                right end; the owner's scripts move messages out (admit)
--   $ns:rec:s:KEY          list  record KEY's admitted messages in accepted order, head at
--                                index 0; the head (and its batch) stays here while in flight
--   $ns:ready:s            zset  record key -> ms (Redis clock) from which it may be taken;
--                                a score in the future is a record waiting (back-off, debounce)
--   $ns:busy:s             hash  record key -> ms it was taken: in flight in a lane
--   $ns:waits:s            hash  record key -> why it waits (JSON), for status
--   $ns:deliveries:s       hash  message sha1 -> times handed to a lane, and the message's
--                                notes: sha1:error, sha1:retries, sha1:since, sha1:write
--   $ns:depth              hash  shard -> admitted messages of records that are not held
--   $ns:held               hash  record key -> the dead letter that holds it
-- A record is in exactly one of: ready (due now or later), busy, held, or nowhere (no
-- messages). Its messages never leave its list until acknowledged, so order holds across
-- waits, crashes and takeovers: a takeover only moves busy records back to ready.
--
-- NOTES (note name -> the suffix of its field in the deliveries hash), SHARD_KEYS and
-- COMMON_KEYS (the key names by position) are generated before this file from the Python
-- that names them (keylane.routing.contract.redis_scripts): never spelled here.


-- The Redis clock in ms: one TIME per script call, and only once asked (a finish that
-- hands nothing out and admits nothing never reads it). A function that is given nil for
-- its now reads it where it needs it.
local NOW_MS = nil
local function now_ms()
  if not NOW_MS then
    local t = redis.call('TIME')
    NOW_MS = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return NOW_MS
end

-- Forget a message's delivery count and notes (it is done, or parked for good).
local function forget(deliveries, digest)
  local fields = {digest}
  for _, suffix in pairs(NOTES) do fields[#fields + 1] = digest .. suffix end
  redis.call('HDEL', deliveries, unpack(fields))
end

-- Base64 (RFC 4648), only for messages that came without keylane's headers (a task sent
-- with Celery's send_task): their record key is inside the encoded body.
local B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'
local function b64decode(data)
  data = string.gsub(data, '[^' .. B64 .. '=]', '')
  return (data:gsub('.', function(x)
    if x == '=' then return '' end
    local r, f = '', (B64:find(x, 1, true) - 1)
    for i = 6, 1, -1 do r = r .. (f % 2 ^ i - f % 2 ^ (i - 1) > 0 and '1' or '0') end
    return r
  end):gsub('%d%d%d?%d?%d?%d?%d?%d?', function(x)
    if #x ~= 8 then return '' end
    local c = 0
    for i = 1, 8 do c = c + (x:sub(i, i) == '1' and 2 ^ (8 - i) or 0) end
    return string.char(c)
  end))
end

-- The headers of a message (an empty table when it is not a Celery message) and its
-- record key: the keylane_record header, else the event's record_key in the body (a
-- message sent with Celery's send_task, or queued by keylane before 0.2; then also the
-- task's keyword arguments, decoded), else '' (a message the lanes will turn into a
-- malformed dead letter, in arrival order).
local function describe(m)
  local ok, envelope = pcall(cjson.decode, m)
  if not ok or type(envelope) ~= 'table' or type(envelope.headers) ~= 'table' then
    return {}, '', nil
  end
  local h = envelope.headers
  if type(h.keylane_record) == 'string' then return h, h.keylane_record, nil end
  if type(envelope.body) == 'string' then
    local okb, body = pcall(cjson.decode, b64decode(envelope.body))
    if okb and type(body) == 'table' and type(body[2]) == 'table' then
      local kw = body[2]
      local key = type(kw.event) == 'table' and kw.event.record_key or kw.record_key
      if type(key) == 'string' then return h, key, kw end
    end
  end
  return h, '', nil
end

-- The dead letter an operator's retry message retries (keylane_retry_of, or the event's
-- retry_of when decoded from the body: a message without keylane's headers), else nil.
local function retry_of_message(h, kw)
  if kw and type(kw.event) == 'table' and kw.event.retry_of ~= cjson.null then
    return kw.event.retry_of
  end
  return h.keylane_retry_of
end

-- The message of record list rec that retries dead letter id (admitted while the record
-- was not held yet), else nil.
local function retry_in(rec, id)
  for _, m in ipairs(redis.call('LRANGE', rec, 0, -1)) do
    local h, _, kw = describe(m)
    local r = retry_of_message(h, kw)
    if r ~= nil and tostring(r) == id then return m end
  end
  return nil
end

-- What one script call learned of a shard (K) that spares reading it again: none_held
-- (nothing is held anywhere), queue_left (the shard queue may hold messages not admitted),
-- and fresh (the records whose first message admit just moved in).
local MEMO = {}
local function memo(K)
  local m = MEMO[K]
  if not m then
    m = {fresh = {}}
    MEMO[K] = m
  end
  return m
end

-- The dead letter that holds record key, else false. Nothing is held anywhere, the usual
-- case, costs one HLEN a script call instead of a look-up per record (memo(K) remembers
-- it; a script that holds a record sets its none_held to false).
local function holder_of(K, key)
  if memo(K).none_held == nil then memo(K).none_held = redis.call('HLEN', K.held) == 0 end
  if memo(K).none_held then return false end
  return redis.call('HGET', K.held, key)
end

local function is_held(K, key)
  return holder_of(K, key) ~= false
end

-- Move up to n messages from the shard queue into their records' lists (K = the shard's
-- keys, see below), in one RPOP: memo(K).queue_left says whether the queue may hold more
-- (it gave all n), and a second call in the same script pops nothing when it gave fewer. A
-- record that gets its first message becomes ready now; a record that is waiting, busy or
-- held keeps its state. Two control messages act here instead: keylane_unhold releases a
-- record held by that dead letter, and the operator's retry of the dead letter that holds
-- its record (keylane_retry_of) goes first in the record's list and releases it.
local function admit(K, shard, now, n)
  if n < 1 or memo(K).queue_left == false then return end
  local popped = redis.call('RPOP', K.queue, n) or {}
  memo(K).queue_left = #popped == n
  if #popped > 0 then now = now or now_ms() end
  for _, m in ipairs(popped) do
    local h, key, kw = describe(m)
    local rec = K.rec_prefix .. key
    local holder = holder_of(K, key)
    local unhold, retry_of = h.keylane_unhold, retry_of_message(h, kw)
    if kw and h.task == 'keylane.unhold' then unhold = kw.dead_letter_id end
    if unhold ~= nil then
      if holder and holder == tostring(unhold) then
        redis.call('HDEL', K.held, key)
        redis.call('HINCRBY', K.depth, shard, redis.call('LLEN', rec))
        if redis.call('LLEN', rec) > 0 and redis.call('HEXISTS', K.busy, key) == 0 then
          redis.call('ZADD', K.ready, 'NX', now, key)
        end
        redis.call('HINCRBY', K.counters, 'released', 1)
      end
    elseif holder and retry_of ~= nil and holder == tostring(retry_of) then
      redis.call('LPUSH', rec, m)
      redis.call('HDEL', K.held, key)
      redis.call('HINCRBY', K.depth, shard, redis.call('LLEN', rec))
      if redis.call('HEXISTS', K.busy, key) == 0 then redis.call('ZADD', K.ready, now, key) end
    else
      local len = redis.call('RPUSH', rec, m)
      if not holder then
        redis.call('HINCRBY', K.depth, shard, 1)
        if len == 1 then
          -- A record with no messages was nowhere: not busy (a busy record's head is in
          -- its list until acknowledged) and not waiting (hand_out drops why it waited).
          redis.call('ZADD', K.ready, 'NX', now, key)
          memo(K).fresh[key] = true
        elseif redis.call('HEXISTS', K.busy, key) == 0 then
          redis.call('ZADD', K.ready, 'NX', now, key)
        end
      else
        redis.call('HINCRBY', K.counters, 'parked', 1)
      end
    end
  end
end

-- Ms until the shard's earliest record in ready is due (0: one is due now), -1: none is
-- there. A lane that is handed a record sets its shard's timer by it, so a record that
-- waits is woken when it is due even while its shard-mates are being handled. after: the
-- score of the record that followed the one just handed out when the caller read it (false:
-- none did), which spares reading ready again; nil: read it.
local function next_due(K, now, after)
  if after == nil then
    local first = redis.call('ZRANGE', K.ready, 0, 0, 'WITHSCORES')
    after = #first > 0 and tonumber(first[2])
  end
  if not after then return -1 end
  return math.max(0, after - now)
end

-- Hand the head of record key's list to a lane (it becomes busy): {key, message,
-- deliveries, held, batch, next due (see next_due, and its after)}. A first delivery whose
-- message carries keylane_batch also takes the record's next messages with the same
-- keylane_batch value that were never handed out, up to the limit it names, while the
-- record is not held: a batch, in order. Only the head is counted: when it is handed out
-- again (a crash, a failure) it goes alone, and so do the ones behind it, each counted then.
local function hand_out(K, key, now, after)
  local rec = K.rec_prefix .. key
  local head = redis.call('LRANGE', rec, 0, 1)
  local m = head[1]
  if not m then
    redis.call('ZREM', K.ready, key)
    redis.call('HDEL', K.busy, key)
    return nil
  end
  now = now or now_ms()
  redis.call('ZREM', K.ready, key)
  redis.call('HSET', K.busy, key, now)
  if not memo(K).fresh[key] then redis.call('HDEL', K.waits, key) end
  local n = redis.call('HINCRBY', K.deliveries, redis.sha1hex(m), 1)
  local held = is_held(K, key) and 1 or 0
  local batch = {}
  if n == 1 and held == 0 then
    local h = describe(m)
    local tag = h.keylane_batch
    local limit = type(tag) == 'string' and tonumber(string.match(tag, '^(%d+):')) or 1
    local i = 1
    while #batch + 1 < limit do
      local nxt
      if i == 1 then nxt = head[2] else nxt = redis.call('LINDEX', rec, i) end
      if not nxt then break end
      local hn = describe(nxt)
      if hn.keylane_batch ~= tag or redis.call('HEXISTS', K.deliveries, redis.sha1hex(nxt)) == 1
      then break end
      batch[#batch + 1] = nxt
      i = i + 1
    end
  end
  return {key, m, n, held, batch, next_due(K, now, after)}
end

-- The shard's next record that is due, handed out; else nil and the ms until the
-- earliest waiting record is due (-1: none waits; 0 also while the shard queue may still
-- hold messages admit has not moved yet: those behind held, busy or waiting records' ones
-- may be due, so the caller looks again now instead of leaving them to the idle poll). The
-- earliest record is due when its score is not after now (what ZRANGEBYSCORE -inf now
-- would give); the one after it sets the timer.
local function take_due(K, now)
  while true do
    local first = redis.call('ZRANGE', K.ready, 0, 1, 'WITHSCORES')
    if #first > 0 then now = now or now_ms() end
    if #first == 0 or tonumber(first[2]) > now then
      if memo(K).queue_left ~= false and redis.call('LLEN', K.queue) > 0 then return nil, 0 end
      if #first == 0 then return nil, -1 end
      return nil, tonumber(first[2]) - now
    end
    local got = hand_out(K, first[1], now, first[4] ~= nil and tonumber(first[4]))
    if got then return got, 0 end
  end
end

-- How many ARGV values one acknowledged message takes (ACK names them, by offset).
local function ack_width()
  local width = 0
  for _ in pairs(ACK) do width = width + 1 end
  return width
end

-- Count an acknowledged message's outcome (the counters, the latency histogram), take it
-- off its source's backlog (backlog: the hash, nil where nothing keeps one) and keep and
-- publish its told outcome on channel; i is its first ARGV value (see ACK). A told outcome
-- is kept under its key (unless replacing, a key already there stands: the first tell,
-- which is what is published).
local function count_and_tell(counters, latency, channel, i, backlog)
  local source = ARGV[i + ACK.backlog_source]
  if backlog and source ~= '' then redis.call('HINCRBY', backlog, source, -1) end
  local outcome = ARGV[i + ACK.outcome]
  if outcome ~= '' then
    redis.call('HINCRBY', counters, outcome, 1)
    local conflicts, attempts = ARGV[i + ACK.conflicts], ARGV[i + ACK.attempts]
    if tonumber(conflicts) > 0 then redis.call('HINCRBY', counters, 'conflicts', conflicts) end
    if tonumber(attempts) > 0 then redis.call('HINCRBY', counters, 'attempts', attempts) end
    local bucket = ARGV[i + ACK.latency_bucket]
    if bucket ~= '' then
      redis.call('HINCRBY', latency, bucket, 1)
      redis.call('HINCRBY', latency, 'count', 1)
      redis.call('HINCRBYFLOAT', latency, 'sum', ARGV[i + ACK.latency_s])
    end
  end
  local told_key = ARGV[i + ACK.told_key]
  if told_key ~= '' then
    local told, ttl = ARGV[i + ACK.told], ARGV[i + ACK.told_ttl_ms]
    if ARGV[i + ACK.told_replace] == '1' then
      redis.call('SET', told_key, told, 'PX', ttl)
    elseif not redis.call('SET', told_key, told, 'PX', ttl, 'NX') then
      told = redis.call('GET', told_key) or told
    end
    redis.call('PUBLISH', channel, told)
  end
end

-- The keys of one shard by name: SHARD_KEYS from KEYS[base + 1 ..], then the deployment's
-- COMMON_KEYS (shared by every shard) from the end of KEYS.
local function shard_keys(base)
  local K = {}
  for i, name in ipairs(SHARD_KEYS) do K[name] = KEYS[base + i] end
  local common = #KEYS - #COMMON_KEYS
  for i, name in ipairs(COMMON_KEYS) do K[name] = KEYS[common + i] end
  return K
end
