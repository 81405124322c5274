-- Remove all of a client's data: subscriptions, topic aliases, session owner and description.
-- KEYS[1] = the client's subscriptions hash
-- KEYS[2] = the client's owner hash (fields node, epoch)
-- KEYS[3] = the client's inbound alias hash (alias -> topic), KEYS[4] = its reverse
-- KEYS[5] = the client's outbound alias hash (alias -> topic), KEYS[6] = its reverse
-- KEYS[7] = the client's alias maximum hash (namespace -> maximum)
-- KEYS[8] = the client's session hash (see router/state/session_store.py)
-- ARGV[1] = the owner node id the caller acts for, or '' to skip the owner check
-- ARGV[2] = the owner epoch the caller holds (decimal), or '' when ARGV[1] is ''
-- returns {subscriptions removed, aliases removed (both namespaces), 1 if an owner was removed else 0}
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_NOT_OWNER (another owner or epoch),
--         ROUTER_CORRUPT (the stored epoch is not an integer); nothing is changed then
--! include owner
--! include keys

local wrong_keys = check_keys({false, false, false, false, false, false, false, false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 2 then
  return redis.error_reply('ROUTER_INVALID client_remove takes node and epoch')
end
local refused = check_owner(KEYS[2], ARGV[1], ARGV[2])
if refused then
  return redis.error_reply(refused)
end
local subscriptions = redis.call('HLEN', KEYS[1])
local aliases = redis.call('HLEN', KEYS[3]) + redis.call('HLEN', KEYS[5])
local owner = redis.call('EXISTS', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
return {subscriptions, aliases, owner}
