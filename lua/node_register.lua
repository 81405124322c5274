-- Register a node process (its incarnation) and give it a first heartbeat.
-- KEYS[1] = the registry hash (node id -> incarnation)
-- KEYS[2] = the heartbeat sorted set (node id scored by expiry, server time in ms)
-- KEYS[3] = the retired hash (node id -> the incarnation that retired): a new incarnation is not
--           retired (its mark goes)
-- ARGV[1] = the node id
-- ARGV[2] = the incarnation id of this node process
-- ARGV[3] = the heartbeat time to live in milliseconds (>= 1)
-- returns {the previously registered incarnation or false, expiry in server ms}
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_CORRUPT (a key holds
--         another type); nothing is changed then
--! include keys

local wrong_keys = check_keys({'hash', 'zset', 'hash'})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 3 or ARGV[1] == '' or ARGV[2] == '' then
  return redis.error_reply('ROUTER_INVALID node_register takes node id, incarnation, ttl ms')
end
if not string.match(ARGV[3], '^[1-9][0-9]*$') or #ARGV[3] > 12 then
  return redis.error_reply('ROUTER_INVALID the ttl must be a positive number of milliseconds')
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local expires = string.format('%.0f', now + tonumber(ARGV[3]))
local previous = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], expires, ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return {previous or false, expires}
