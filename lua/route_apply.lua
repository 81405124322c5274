-- Apply a batch of route changes to a node's route set and log each effective change.
-- KEYS[1] = the node's routes hash (route -> member count)
-- KEYS[2] = the node's route change stream (entry id VERSION-0, fields r = route, n = count)
-- KEYS[3] = the node's meta hash (incarnation, generation, version)
-- ARGV[1] = the incarnation id of the writing node process
-- ARGV[2] = the stream's maximum length (>= 1; trimmed exactly on every append)
-- ARGV[3], ARGV[4], ... = route, count pairs in order (count 0 removes the route)
-- returns {version after the batch, v1, v2, ...}: vi is the version of pair i's change,
--         or 0 when pair i changed nothing (the route already had that count)
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_NO_ROUTES (no route set: claim it first),
--         ROUTER_STALE_INCARNATION (another incarnation claimed it), ROUTER_CORRUPT (the stored
--         version is not an integer or the stream is ahead of it); nothing is changed then
--
-- The version grows by exactly one per effective change and is the id of its stream entry,
-- so a reader can tell a gap (a trimmed or vanished stream) from the entries it gets.
--! include keys

local wrong_keys = check_keys({false, false, false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

local n = #ARGV
if n < 2 or n % 2 ~= 0 or ARGV[1] == '' then
  return redis.error_reply('ROUTER_INVALID route_apply takes incarnation, max length, pairs')
end
if not string.match(ARGV[2], '^[1-9][0-9]*$') or #ARGV[2] > 12 then
  return redis.error_reply('ROUTER_INVALID the stream max length must be a positive integer')
end
for i = 3, n, 2 do
  if #ARGV[i] == 0 or #ARGV[i] > 65535 then
    return redis.error_reply('ROUTER_INVALID a route must be 1..65535 bytes')
  end
  if not string.match(ARGV[i + 1], '^[0-9]+$') or #ARGV[i + 1] > 15 then
    return redis.error_reply('ROUTER_INVALID a route count must be an integer >= 0')
  end
  if #ARGV[i + 1] > 1 and string.sub(ARGV[i + 1], 1, 1) == '0' then
    return redis.error_reply('ROUTER_INVALID a route count must be in canonical form')
  end
end
local meta = redis.call('HMGET', KEYS[3], 'incarnation', 'version')
if not meta[1] then
  return redis.error_reply('ROUTER_NO_ROUTES the route set does not exist: claim it')
end
if meta[1] ~= ARGV[1] then
  return redis.error_reply('ROUTER_STALE_INCARNATION another incarnation owns the route set')
end
if not meta[2] or not string.match(meta[2], '^[0-9]+$') or #meta[2] > 15 then
  return redis.error_reply('ROUTER_CORRUPT the stored route version is not an integer')
end
local version = tonumber(meta[2])
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
if #last > 0 then
  local last_version = tonumber(string.match(last[1][1], '^([0-9]+)-'))
  if last_version == nil or last_version > version then
    return redis.error_reply('ROUTER_CORRUPT the route stream is ahead of the version')
  end
end
local results = {0}
for i = 3, n, 2 do
  local route, count = ARGV[i], ARGV[i + 1]
  local current = redis.call('HGET', KEYS[1], route)
  local changed = false
  if count == '0' then
    if current then
      redis.call('HDEL', KEYS[1], route)
      changed = true
    end
  elseif current ~= count then
    redis.call('HSET', KEYS[1], route, count)
    changed = true
  end
  if changed then
    version = version + 1
    local id = string.format('%.0f-0', version)
    redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[2], id, 'r', route, 'n', count)
    results[#results + 1] = version
  else
    results[#results + 1] = 0
  end
end
redis.call('HSET', KEYS[3], 'version', string.format('%.0f', version))
results[1] = version
return results
