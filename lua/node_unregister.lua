-- Remove a node from the registry (after its route set was purged).
-- KEYS[1] = the registry hash (node id -> incarnation)
-- KEYS[2] = the heartbeat sorted set (node id scored by expiry, server time in ms)
-- KEYS[3] = the retired hash (node id -> the incarnation that retired): its mark goes too
-- ARGV[1] = the node id
-- ARGV[2] = the incarnation to remove, or '' for whichever is registered
-- returns 1 if the node was removed, 0 if it was not registered or another incarnation is
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_CORRUPT (a key holds
--         another type); nothing is changed then
--! include keys

local wrong_keys = check_keys({'hash', 'zset', 'hash'})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 2 or ARGV[1] == '' then
  return redis.error_reply('ROUTER_INVALID node_unregister takes node id, incarnation')
end
local registered = redis.call('HGET', KEYS[1], ARGV[1])
if not registered or (ARGV[2] ~= '' and registered ~= ARGV[2]) then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
