-- Retire a node that leaves gracefully, if the caller is its current incarnation: not alive now.
-- KEYS[1] = the registry hash (node id -> incarnation)
-- KEYS[2] = the heartbeat sorted set (node id scored by expiry, server time in ms)
-- KEYS[3] = the retired hash (node id -> the incarnation that retired)
-- ARGV[1] = the node id
-- ARGV[2] = the incarnation id of the calling node process
-- returns the server time in ms (decimal string): the node's heartbeat expiry from now on
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_CORRUPT (a key holds another type),
--         ROUTER_NOT_REGISTERED (the node is not registered: never, or purged),
--         ROUTER_STALE_INCARNATION (another incarnation registered); nothing is changed then
--! include keys

local wrong_keys = check_keys({'hash', 'zset', 'hash'})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 2 or ARGV[1] == '' or ARGV[2] == '' then
  return redis.error_reply('ROUTER_INVALID node_retire takes node id, incarnation')
end
local registered = redis.call('HGET', KEYS[1], ARGV[1])
if not registered then
  return redis.error_reply('ROUTER_NOT_REGISTERED the node is not registered')
end
if registered ~= ARGV[2] then
  return redis.error_reply('ROUTER_STALE_INCARNATION another incarnation of the node registered')
end
local time = redis.call('TIME')
local now = string.format('%.0f', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
return now
