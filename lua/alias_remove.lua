-- Forget every topic alias of a client (both namespaces) and its alias maximums.
-- KEYS[1] = the inbound ('client') alias hash, KEYS[2] = its reverse hash
-- KEYS[3] = the outbound ('server') alias hash, KEYS[4] = its reverse hash
-- KEYS[5] = the client's alias maximum hash
-- ARGV: none
-- returns the number of aliases forgotten
-- errors: ROUTER_INVALID (ARGV given, malformed KEYS)
--! include keys

local wrong_keys = check_keys({false, false, false, false, false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 0 then
  return redis.error_reply('ROUTER_INVALID alias_remove takes no arguments')
end
local count = redis.call('HLEN', KEYS[1]) + redis.call('HLEN', KEYS[3])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
return count
