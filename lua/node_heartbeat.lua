-- Extend a registered node's heartbeat, if the caller is its current incarnation.
-- KEYS[1] = the registry hash (node id -> incarnation)
-- KEYS[2] = the heartbeat sorted set (node id scored by expiry, server time in ms)
-- ARGV[1] = the node id
-- ARGV[2] = the incarnation id of the calling node process
-- ARGV[3] = the heartbeat time to live in milliseconds (>= 1)
-- returns the new expiry in server ms (decimal string)
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_NOT_REGISTERED (the node is not registered:
--         never, or purged as dead), ROUTER_STALE_INCARNATION (another incarnation registered)
--! include keys

local wrong_keys = check_keys({false, false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 3 or ARGV[1] == '' or ARGV[2] == '' then
  return redis.error_reply('ROUTER_INVALID node_heartbeat takes node id, incarnation, ttl ms')
end
if not string.match(ARGV[3], '^[1-9][0-9]*$') or #ARGV[3] > 12 then
  return redis.error_reply('ROUTER_INVALID the ttl must be a positive number of milliseconds')
end
local registered = redis.call('HGET', KEYS[1], ARGV[1])
if not registered then
  return redis.error_reply('ROUTER_NOT_REGISTERED the node is not registered')
end
if registered ~= ARGV[2] then
  return redis.error_reply('ROUTER_STALE_INCARNATION another incarnation of the node registered')
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local expires = string.format('%.0f', now + tonumber(ARGV[3]))
redis.call('ZADD', KEYS[2], expires, ARGV[1])
return expires
