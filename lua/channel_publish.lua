-- Store a batch of messages on one channel, each message id at most once per dedup window.
-- KEYS[1]   = the channel clock (string: an integer in +-(2^53-1))
-- KEYS[2]   = the base of the channel's body keys: the body stored at clock C is KEYS[2]..C.
--             Body keys are derived here from this declared base (same hash tag): only this
--             script knows the clocks it assigns. A body is "<id length>:<id><content>".
-- KEYS[2+i] = the dedup key of message i (string: the clock message i was stored at)
-- ARGV[1]   = TTL in seconds (a positive integer) of every key written: channel expiry plus a
--             clock-drift margin, rounded up; it is also the dedup window
-- ARGV[2]   = the pub/sub channel that announces new messages (it starts like the clock key,
--             up to the end of its hash tag)
-- ARGV[3]   = push budget in bytes (a non-negative integer): 0 announces only the new clock;
--             otherwise the announcement carries the stored bodies too, while they fit
-- ARGV[4]   = how to announce: 'PUBLISH', or 'SPUBLISH' (a shard channel: on a Redis Cluster
--             it stays on the shard that serves the channel, instead of reaching every node;
--             the wake-up channel has the clock key's hash tag, so it is in the same slot)
-- ARGV[3+2i], ARGV[4+2i] = message i's id and content (bytes)
-- Each message whose id is not in the dedup window (nor earlier in the batch) advances the
-- clock (2^53-1 is followed by -(2^53-1)) and is stored at the new clock with its dedup key;
-- the clock is written once, with the TTL. Duplicates store nothing and move no clock.
-- One announcement is published exactly when at least one message was stored: the last clock
-- stored ("<clock>"), or, with a push budget that the stored bodies fit in,
-- "P<first clock>:" followed by "<body length>:<body>" for each stored message in clock order.
-- returns {before, duplicates}: before = the clock before this call (0 for a new channel); the
--         messages stored got the clocks after it, in batch order; duplicates = "" or a list
--         "i:clock,i:clock,..." of the batch positions (1-based) of the duplicates with the
--         clock of their original message (a compact reply: big batches are mostly new).
--         An empty batch returns {} and changes nothing.
-- errors: ROUTER_INVALID (malformed ARGV, keys or wake-up channel of more than one channel),
--         ROUTER_CORRUPT (the clock or a dedup value is not an integer clock); nothing is
--         changed then
--! include clocks
local CHUNK = 1000

local n = #KEYS - 2
if n < 0 or #ARGV ~= 4 + 2 * n then
  return redis.error_reply('ROUTER_INVALID channel_publish takes clock, body base, one dedup key '
    .. 'per message; TTL, wake-up channel, push budget, announce command, id and content per '
    .. 'message')
end
local announce = ARGV[4]
if announce ~= 'PUBLISH' and announce ~= 'SPUBLISH' then
  return redis.error_reply('ROUTER_INVALID the announce command must be PUBLISH or SPUBLISH')
end
local ttl = ARGV[1]
if not string.match(ttl, '^[1-9]%d*$') or #ttl > 12 then
  return redis.error_reply('ROUTER_INVALID the TTL must be a positive integer of seconds')
end
local tag = tag_of(KEYS[1])
if not tag then
  return redis.error_reply('ROUTER_INVALID the clock key has no hash tag')
end
-- A key has the clock key's hash tag exactly when it starts with everything of the clock key
-- up to the end of that tag (the tag is the first {...}): a prefix test, no substring made.
for i = 2, #KEYS do
  if string.find(KEYS[i], tag, 1, true) ~= 1 then
    return redis.error_reply('ROUTER_INVALID a batch must not mix channels')
  end
end
-- The wake-up channel too: on a cluster, SPUBLISH to a channel of another slot fails, and by
-- then the messages would be stored.
if string.find(ARGV[2], tag, 1, true) ~= 1 then
  return redis.error_reply('ROUTER_INVALID the wake-up channel must have the clock key\'s hash tag')
end
local budget = ARGV[3]
if not string.match(budget, '^%d+$') or #budget > 12 then
  return redis.error_reply('ROUTER_INVALID the push budget must be a non-negative integer')
end
budget = tonumber(budget)
for i = 1, n do
  local id = ARGV[3 + 2 * i]
  if #id == 0 or #id > 65535 then
    return redis.error_reply('ROUTER_INVALID a message id must be 1..65535 bytes')
  end
end
if n == 0 then
  return {}
end

-- Read and check everything before writing anything.
local raw, bad = read(KEYS[1])
if bad then
  return redis.error_reply('ROUTER_CORRUPT the channel clock is not a string')
end
local clock = 0
if raw then
  clock = to_clock(raw)
  if not clock then
    return redis.error_reply('ROUTER_CORRUPT the channel clock is not an integer clock')
  end
end
local known = {}
for first = 3, #KEYS, CHUNK do
  local last = math.min(first + CHUNK - 1, #KEYS)
  local values = redis.call('MGET', unpack(KEYS, first, last))
  for j = 1, #values do
    local value = values[j]
    if value then
      local original = to_clock(value)
      if not original then
        return redis.error_reply('ROUTER_CORRUPT a dedup entry is not an integer clock')
      end
      known[first - 3 + j] = original
    end
  end
end

local before = clock
local duplicates = {}
local in_batch = {}
local stored = 0
local heads = {} -- "<id length>:" by id length: ids of a batch mostly share one length
local first = nil
local pushed = {}
local pushed_bytes = 0
for i = 1, n do
  local dedup = KEYS[2 + i]
  local original = known[i] or in_batch[dedup]
  if original then
    duplicates[#duplicates + 1] = i .. ':' .. string.format('%.0f', original)
  else
    if clock == LIMIT then
      clock = -LIMIT
    else
      clock = clock + 1
    end
    local text = string.format('%.0f', clock)
    local id = ARGV[3 + 2 * i]
    local head = heads[#id]
    if not head then
      head = #id .. ':'
      heads[#id] = head
    end
    local body = head .. id .. ARGV[4 + 2 * i]
    redis.call('SET', KEYS[2] .. text, body, 'EX', ttl)
    if not first then
      first = text
    end
    pushed_bytes = pushed_bytes + #body
    if pushed_bytes <= budget then
      pushed[#pushed + 1] = #body .. ':' .. body
    end
    redis.call('SET', dedup, text, 'EX', ttl)
    in_batch[dedup] = clock
    stored = stored + 1
  end
end
if stored > 0 then
  local text = string.format('%.0f', clock)
  redis.call('SET', KEYS[1], text, 'EX', ttl)
  if pushed_bytes <= budget then
    redis.call(announce, ARGV[2], 'P' .. first .. ':' .. table.concat(pushed))
  else
    redis.call(announce, ARGV[2], text)
  end
end
return {before, table.concat(duplicates, ',')}
