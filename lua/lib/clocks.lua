-- Shared by the channel scripts (included with `--! include clocks`, see router/state/scripts.py).
-- LIMIT: the largest clock; clocks run over +-LIMIT and wrap from LIMIT to -LIMIT.
-- to_clock(value): the integer clock a stored or given string holds, or nil if it is not one.
-- tag_of(key): the key up to the end of its hash tag (the first {...}), or nil without one.
-- read(key): the string at key (nil when missing), and true as a second result when the key
--            holds another type (the caller reports ROUTER_CORRUPT).
-- read_position(clock_key, cursor_key): the channel clock and a subscriber's cursor as integer
--            clocks; or nil and the coded error message (ROUTER_NO_SUBSCRIPTION when either
--            is missing, ROUTER_CORRUPT when either is not an integer clock).
local LIMIT = 9007199254740991

local function to_clock(value)
  if type(value) ~= 'string' or #value > 17 or not string.match(value, '^%-?%d+$') then
    return nil
  end
  local n = tonumber(value)
  if n > LIMIT or n < -LIMIT then
    return nil
  end
  return n
end

local function tag_of(key)
  local s = string.find(key, '{', 1, true)
  local e = s and string.find(key, '}', s + 1, true)
  if not e or e == s + 1 then
    return nil
  end
  return string.sub(key, 1, e)
end

local function read(key)
  local value = redis.pcall('GET', key)
  if type(value) == 'table' then
    return nil, true
  end
  return value, false
end

local function read_position(clock_key, cursor_key)
  local raw_clock, bad_clock = read(clock_key)
  local raw_cursor, bad_cursor = read(cursor_key)
  if bad_clock or bad_cursor then
    return nil, 'ROUTER_CORRUPT the channel clock or the cursor is not a string'
  end
  if not raw_clock or not raw_cursor then
    return nil, 'ROUTER_NO_SUBSCRIPTION the subscriber or its channel does not exist'
  end
  local clock = to_clock(raw_clock)
  if not clock then
    return nil, 'ROUTER_CORRUPT the channel clock is not an integer clock'
  end
  local cursor = to_clock(raw_cursor)
  if not cursor then
    return nil, 'ROUTER_CORRUPT the subscriber cursor is not an integer clock'
  end
  return clock, cursor
end
