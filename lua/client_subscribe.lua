-- Add or replace a batch of a client's subscriptions, if the caller owns the session.
-- KEYS[1] = the client's subscriptions hash (filter -> packed options)
-- KEYS[2] = the client's owner hash (fields node, epoch)
-- ARGV[1] = the owner node id the caller acts for, or '' to skip the owner check
-- ARGV[2] = the owner epoch the caller holds (decimal), or '' when ARGV[1] is ''
-- ARGV[3], ARGV[4], ... = filter, packed options; pairs in order (a later pair for a filter wins)
-- returns an array with one integer per pair: 1 if the filter was new, 0 if it replaced one
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_NOT_OWNER (another owner or epoch),
--         ROUTER_CORRUPT (the stored epoch is not an integer); nothing is changed then
--! include owner
--! include pairs
--! include keys

local wrong_keys = check_keys({false, false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

local n = #ARGV
if n < 2 or n % 2 ~= 0 then
  return redis.error_reply('ROUTER_INVALID client_subscribe takes node, epoch, filter/options pairs')
end
local malformed = check_pairs(3)
if malformed then
  return redis.error_reply(malformed)
end
local refused = check_owner(KEYS[2], ARGV[1], ARGV[2])
if refused then
  return redis.error_reply(refused)
end
local results = {}
for i = 3, n, 2 do
  results[#results + 1] = redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
return results
