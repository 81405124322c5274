-- Delete a node's route set, change stream and meta together (idempotent).
-- KEYS[1] = the node's routes hash
-- KEYS[2] = the node's route change stream
-- KEYS[3] = the node's meta hash (incarnation, generation, version)
-- ARGV[1] = the incarnation to purge, or '' to purge whatever is there
-- returns {status, routes deleted}: status 'purged' (something was deleted), 'absent' (nothing
--         was there) or 'skipped' (another incarnation owns the route set: left alone)
-- errors: ROUTER_INVALID (malformed ARGV or KEYS)
--! include keys

local wrong_keys = check_keys({false, false, false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 1 then
  return redis.error_reply('ROUTER_INVALID route_purge takes one incarnation (or empty)')
end
local incarnation = redis.call('HGET', KEYS[3], 'incarnation')
if ARGV[1] ~= '' and incarnation and incarnation ~= ARGV[1] then
  return {'skipped', 0}
end
local routes = redis.call('HLEN', KEYS[1])
local deleted = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
if deleted == 0 then
  return {'absent', 0}
end
return {'purged', routes}
