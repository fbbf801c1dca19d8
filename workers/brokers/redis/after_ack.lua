-- include: _shared.lua
-- What finish.lua counts and tells, for a broker that acknowledges elsewhere (RabbitMQ,
-- with this Redis as its helper), after its acknowledgement: each message's outcome
-- counted, and its told outcome kept and published (count_and_tell), in one step.
-- KEYS: counters, latency.
-- ARGV: the outcomes channel, then per acknowledged message the values ACK names, as
-- finish.lua takes them (the message itself is not read).
local counters, latency, channel = KEYS[1], KEYS[2], ARGV[1]
for i = 2, #ARGV, ack_width() do
  count_and_tell(counters, latency, channel, i)
end
return 1
