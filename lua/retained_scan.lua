-- Read or delete the retained messages of one shard that match a filter, in topic order,
-- looking at no topic outside the filter's literal prefix and at most a budget of them.
-- KEYS[1] = the shard's topics sorted set (every score 0: ordered by topic bytes)
-- KEYS[2] = the shard's messages hash (topic -> packed message)
-- KEYS[3] = the shard's expiry sorted set (topic -> expiry time, server ms)
-- ARGV[1] = 'read' or 'delete'
-- ARGV[2] = the filter, with a literal first level (the shard's; no '$share/')
-- ARGV[3] = a topic to look at on its own before the range ('' for none): the filter
--           itself when it has no wildcard, the parent level of a trailing '#'
-- ARGV[4] = the literal prefix of the range to scan, ending in '/' ('' for no range)
-- ARGV[5] = the last topic of the range already looked at ('' to start the range)
-- ARGV[6] = the budget: at most this many range topics are looked at (>= 1)
-- ARGV[7] = read: at most this many messages are returned (>= 1); delete: ignored
-- returns {done, last, examined, ...}: done is 1 when the range is exhausted, last the
--   last topic looked at ('' if none), examined how many topics were looked at; then for
--   'read' a flat list of topic, packed message, ms to expiry (-1: never) per visible
--   match; for 'delete' the number of matches deleted (expired ones included) and the
--   bytes their packed messages held
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_CORRUPT (a key holds
--         another type); nothing is changed then
--! include keys

local wrong_keys = check_keys({'zset', 'hash', 'zset'})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 7 or (ARGV[1] ~= 'read' and ARGV[1] ~= 'delete') or ARGV[2] == '' then
  return redis.error_reply('ROUTER_INVALID retained_scan takes mode, filter, topic, prefix, '
    .. 'after, budget, limit')
end
if not string.match(ARGV[6], '^[1-9][0-9]*$') or #ARGV[6] > 12
    or not string.match(ARGV[7], '^[1-9][0-9]*$') or #ARGV[7] > 12 then
  return redis.error_reply('ROUTER_INVALID budget and limit must be positive integers')
end
local budget = tonumber(ARGV[6])
local limit = tonumber(ARGV[7])
local deleting = ARGV[1] == 'delete'

local function split(text)
  local levels = {}
  local start = 1
  while true do
    local slash = string.find(text, '/', start, true)
    if not slash then
      levels[#levels + 1] = string.sub(text, start)
      return levels
    end
    levels[#levels + 1] = string.sub(text, start, slash - 1)
    start = slash + 1
  end
end

local filter = split(ARGV[2])
local function matches(topic)
  local levels = split(topic)
  for index, level in ipairs(filter) do
    if level == '#' then
      return true
    end
    if index > #levels or (level ~= '+' and level ~= levels[index]) then
      return false
    end
  end
  return #filter == #levels
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local result = {0, '', 0}
local deleted = 0
local freed = 0

-- Returns true once the read limit is reached.
local function visit(topic)
  result[2] = topic
  result[3] = result[3] + 1
  if not matches(topic) then
    return false
  end
  if deleting then
    freed = freed + redis.call('HSTRLEN', KEYS[2], topic)
    deleted = deleted + redis.call('HDEL', KEYS[2], topic)
    redis.call('ZREM', KEYS[1], topic)
    redis.call('ZREM', KEYS[3], topic)
    return false
  end
  local message = redis.call('HGET', KEYS[2], topic)
  if not message then
    return false
  end
  local left = -1
  local expires = redis.call('ZSCORE', KEYS[3], topic)
  if expires then
    left = tonumber(expires) - now
    if left <= 0 then
      return false
    end
  end
  result[#result + 1] = topic
  result[#result + 1] = message
  result[#result + 1] = left
  return (#result - 3) / 3 >= limit
end

local function finish(done)
  result[1] = done
  if deleting then
    result[4] = deleted
    result[5] = freed
  end
  return result
end

if ARGV[3] ~= '' and visit(ARGV[3]) then
  return finish(ARGV[4] == '' and 1 or 0)
end
if ARGV[4] == '' then
  return finish(1)
end
local low = '[' .. ARGV[4]
if ARGV[5] ~= '' then
  low = '(' .. ARGV[5]
end
local topics = redis.call('ZRANGEBYLEX', KEYS[1], low, '(' .. ARGV[4] .. '\255', 'LIMIT', 0, budget)
for index, topic in ipairs(topics) do
  if visit(topic) then
    return finish((index == #topics and #topics < budget) and 1 or 0)
  end
end
return finish(#topics < budget and 1 or 0)
