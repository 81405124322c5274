-- Remove a batch of a client's subscriptions, if the caller owns the session.
-- KEYS[1] = the client's subscriptions hash (filter -> packed options)
-- KEYS[2] = the client's owner hash (fields node, epoch)
-- ARGV[1] = the owner node id the caller acts for, or '' to skip the owner check
-- ARGV[2] = the owner epoch the caller holds (decimal), or '' when ARGV[1] is ''
-- ARGV[3], ARGV[4], ... = the filters to remove
-- returns an array with one integer per filter: 1 if it was removed, 0 if it was not there
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_NOT_OWNER (another owner or epoch),
--         ROUTER_CORRUPT (the stored epoch is not an integer); nothing is changed then
--! include owner
--! include keys

local wrong_keys = check_keys({false, false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

local n = #ARGV
if n < 2 then
  return redis.error_reply('ROUTER_INVALID client_unsubscribe takes node, epoch, filters')
end
for i = 3, n do
  if #ARGV[i] == 0 or #ARGV[i] > 65535 then
    return redis.error_reply('ROUTER_INVALID a filter must be 1..65535 bytes')
  end
end
local refused = check_owner(KEYS[2], ARGV[1], ARGV[2])
if refused then
  return redis.error_reply(refused)
end
local results = {}
for i = 3, n do
  results[#results + 1] = redis.call('HDEL', KEYS[1], ARGV[i])
end
return results
