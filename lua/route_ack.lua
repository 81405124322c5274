-- Record that a reader's route mirror holds a writer node's route set up to a version, and
-- tell the writer (a node waiting to acknowledge a subscription waits for these).
-- KEYS[1] = the writer node's route acks hash (reader node id -> 'generation version')
-- ARGV[1] = the reader node id
-- ARGV[2] = the generation of the writer's route set the reader holds
-- ARGV[3] = the version of that generation the reader holds (an integer >= 0)
-- ARGV[4] = the pub/sub channel the writer listens on (a message 'generation version reader')
-- ARGV[5] = the hash's time to live in milliseconds (>= 1), renewed on every ack
-- returns 1
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_CORRUPT (KEYS[1] is not a hash)
--! include keys

local wrong_keys = check_keys({'hash'})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 5 or ARGV[1] == '' or ARGV[2] == '' or ARGV[4] == '' then
  return redis.error_reply('ROUTER_INVALID route_ack takes reader, generation, version, channel, ttl ms')
end
if not string.match(ARGV[3], '^[0-9]+$') or #ARGV[3] > 15 then
  return redis.error_reply('ROUTER_INVALID the version must be an integer >= 0')
end
if not string.match(ARGV[5], '^[1-9][0-9]*$') or #ARGV[5] > 12 then
  return redis.error_reply('ROUTER_INVALID the ttl must be a positive number of milliseconds')
end
if string.find(ARGV[2], ' ', 1, true) then
  return redis.error_reply('ROUTER_INVALID a generation holds no space')
end
local seen = ARGV[2] .. ' ' .. ARGV[3]
redis.call('HSET', KEYS[1], ARGV[1], seen)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('PUBLISH', ARGV[4], seen .. ' ' .. ARGV[1])
return 1
