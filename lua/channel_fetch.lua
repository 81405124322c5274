-- Read a subscriber's unacknowledged messages without moving its cursor.
-- KEYS[1] = the channel clock (string: an integer in +-(2^53-1))
-- KEYS[2] = the subscriber's cursor (string: the last clock it acknowledged)
-- KEYS[3] = the base of the channel's body keys: the body stored at clock C is KEYS[3]..C.
--           Body keys are derived here from this declared base (same hash tag): which clocks
--           to read is only known inside the script. A body is "<id length>:<id><content>".
-- KEYS[4] = the channel's epoch (see channel_add_subscriber.lua): its TTL is extended too
-- ARGV[1] = max: return at most this many messages (a positive integer)
-- ARGV[2] = TTL in seconds (a positive integer) for the clock and the cursor
-- ARGV[3] = scan budget: examine at most this many clocks (>= max), so that a long run of
--           expired clocks costs bounded time per call
-- ARGV[4] = resume after this clock instead of after the cursor, or '' for the cursor; it is
--           ignored (the cursor is used) unless it is a valid ack position: cursor < it <= clock,
--           or after a wrap (clock < cursor) cursor < it or it <= clock
-- Clocks are examined in iteration order from the start to the channel clock; the clock after
-- 2^53-1 is -(2^53-1). Missing (expired) and malformed bodies are skipped.
-- returns {examined, last, more, clock_1, body_1, ..., clock_k, body_k}: how many clocks were
--         examined, the last one examined (the ack position; meaningless when examined = 0),
--         more = 1 exactly when it stopped before the channel clock, and the k <= max messages
--         found, in iteration order. The TTLs of clock and cursor are extended.
-- errors: ROUTER_INVALID (malformed ARGV, keys of two hash tags), ROUTER_NO_SUBSCRIPTION (cursor
--         or clock missing), ROUTER_CORRUPT (clock or cursor not an integer clock); nothing is
--         changed then
--! include clocks
local CHUNK = 256

local function positive(value)
  if not string.match(value, '^[1-9]%d*$') or #value > 12 then
    return nil
  end
  return tonumber(value)
end

if #KEYS ~= 4 or #ARGV ~= 4 then
  return redis.error_reply('ROUTER_INVALID channel_fetch takes 4 keys, max, TTL, budget, start')
end
local tag = tag_of(KEYS[1])
if not tag or tag_of(KEYS[2]) ~= tag or tag_of(KEYS[3]) ~= tag or tag_of(KEYS[4]) ~= tag then
  return redis.error_reply('ROUTER_INVALID the keys must belong to one channel')
end
local max = positive(ARGV[1])
local ttl = positive(ARGV[2])
local budget = positive(ARGV[3])
if not max or not ttl or not budget or budget < max then
  return redis.error_reply('ROUTER_INVALID max, TTL and budget must be positive integers, budget >= max')
end
local resume = nil
if ARGV[4] ~= '' then
  resume = to_clock(ARGV[4])
  if not resume then
    return redis.error_reply('ROUTER_INVALID the resume position must be an integer clock')
  end
end

local clock, cursor = read_position(KEYS[1], KEYS[2])
if not clock then
  return redis.error_reply(cursor)
end

local pos = cursor
if resume then
  local valid
  if cursor <= clock then
    valid = cursor < resume and resume <= clock
  else
    valid = cursor < resume or resume <= clock
  end
  if valid then
    pos = resume
  end
end

redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
redis.call('EXPIRE', KEYS[4], ARGV[2])

local out = {0, 0, 0}
local found = 0
local examined = 0
while found < max and examined < budget and pos ~= clock do
  local want = math.min(max - found, budget - examined, CHUNK)
  local clocks = {}
  local keys = {}
  local p = pos
  for i = 1, want do
    if p == LIMIT then
      p = -LIMIT
    else
      p = p + 1
    end
    clocks[i] = p
    keys[i] = KEYS[3] .. string.format('%.0f', p)
    if p == clock then
      break
    end
  end
  local bodies = redis.call('MGET', unpack(keys))
  for i = 1, #clocks do
    local body = bodies[i]
    if body then
      local digits = string.match(body, '^(%d%d?%d?%d?%d?):')
      if digits and #body >= #digits + 1 + tonumber(digits) then
        found = found + 1
        out[#out + 1] = clocks[i]
        out[#out + 1] = body
      end
    end
  end
  examined = examined + #clocks
  pos = clocks[#clocks]
end
out[1] = examined
out[2] = pos
if pos ~= clock then
  out[3] = 1
end
return out
