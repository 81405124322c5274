-- Bulk import: add or replace a batch of one client's subscriptions, writing only changes.
-- KEYS[1] = the client's subscriptions hash (filter -> packed options)
-- ARGV[1], ARGV[2], ... = filter, packed options; pairs in order (a later pair for a filter wins)
-- returns an array with one integer per pair: 1 if the filter was new, 2 if it replaced
--         other options, 0 if the same options were stored already (nothing written)
-- errors: ROUTER_INVALID (malformed ARGV or KEYS); nothing is changed then
-- The session owner is not checked: an import loads clients no node serves right now.
--! include pairs
--! include keys

local wrong_keys = check_keys({false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

local n = #ARGV
if n == 0 or n % 2 ~= 0 then
  return redis.error_reply('ROUTER_INVALID import_subscriptions takes filter/options pairs')
end
local malformed = check_pairs(1)
if malformed then
  return redis.error_reply(malformed)
end
local results = {}
for i = 1, n, 2 do
  local stored = redis.call('HGET', KEYS[1], ARGV[i])
  if stored == ARGV[i + 1] then
    results[#results + 1] = 0
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    results[#results + 1] = stored and 2 or 1
  end
end
return results
