-- Add or replace a batch of a client's subscriptions, if the caller owns the session.
-- KEYS[1] = the client's subscriptions hash (filter -> packed options)
-- KEYS[2] = the client's owner hash (fields node, epoch)
-- ARGV[1] = the owner node id the caller acts for, or '' to skip the owner check
-- ARGV[2] = the owner epoch the caller holds (decimal), or '' when ARGV[1] is ''
-- ARGV[3], ARGV[4], ... = filter, packed options; pairs in order (a later pair for a filter wins)
-- returns an array with one integer per pair: 1 if the filter was new, 0 if it replaced one
-- errors: ROUTER_INVALID (malformed ARGV), ROUTER_NOT_OWNER (another owner or epoch),
--         ROUTER_CORRUPT (the stored epoch is not an integer); nothing is changed then
local function check_owner(owner_key, node, epoch)
  if node == '' then
    if epoch ~= '' then
      return 'ROUTER_INVALID an epoch needs a node id'
    end
    return nil
  end
  if not string.match(epoch, '^[1-9][0-9]*$') then
    return 'ROUTER_INVALID the owner epoch must be a positive integer'
  end
  local current = redis.call('HMGET', owner_key, 'node', 'epoch')
  if not current[1] then
    return 'ROUTER_NOT_OWNER no node owns the session'
  end
  if not current[2] or not string.match(current[2], '^[1-9][0-9]*$') then
    return 'ROUTER_CORRUPT the stored owner epoch is not an integer'
  end
  if current[1] ~= node or current[2] ~= epoch then
    return 'ROUTER_NOT_OWNER the session is owned by another node or epoch'
  end
  return nil
end

local n = #ARGV
if n < 2 or n % 2 ~= 0 then
  return redis.error_reply('ROUTER_INVALID client_subscribe takes node, epoch, filter/options pairs')
end
for i = 3, n, 2 do
  if #ARGV[i] == 0 or #ARGV[i] > 65535 then
    return redis.error_reply('ROUTER_INVALID a filter must be 1..65535 bytes')
  end
  if #ARGV[i + 1] == 0 then
    return redis.error_reply('ROUTER_INVALID packed options must not be empty')
  end
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
