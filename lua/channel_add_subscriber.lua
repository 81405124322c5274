-- Create a channel subscriber whose cursor is the current channel clock (it never sees
-- earlier messages). Creating the channel clock when it is missing sets it to 0.
-- KEYS[1] = the channel clock (string: an integer in +-(2^53-1))
-- KEYS[2] = the subscriber's cursor (string: the last clock it acknowledged)
-- ARGV[1] = TTL in seconds (a positive integer) for a new cursor and the clock
-- returns 1 when the subscriber was created, 0 when it existed already: then nothing changes,
--         neither the cursor nor any TTL. A cursor left without its clock (the clock expired)
--         is a lost subscriber: it is created again at the new clock, 0.
-- errors: ROUTER_INVALID (malformed ARGV, keys of two hash tags), ROUTER_CORRUPT (the clock
--         or cursor is not an integer clock); nothing is changed then
--! include clocks

if #KEYS ~= 2 or #ARGV ~= 1 then
  return redis.error_reply('ROUTER_INVALID channel_add_subscriber takes 2 keys and a TTL')
end
if not tag_of(KEYS[1]) or tag_of(KEYS[2]) ~= tag_of(KEYS[1]) then
  return redis.error_reply('ROUTER_INVALID the keys must belong to one channel')
end
local ttl = ARGV[1]
if not string.match(ttl, '^[1-9]%d*$') or #ttl > 12 then
  return redis.error_reply('ROUTER_INVALID the TTL must be a positive integer of seconds')
end

local clock, bad_clock = read(KEYS[1])
local cursor, bad_cursor = read(KEYS[2])
if bad_clock or bad_cursor then
  return redis.error_reply('ROUTER_CORRUPT the channel clock or the cursor is not a string')
end
if clock and not to_clock(clock) then
  return redis.error_reply('ROUTER_CORRUPT the channel clock is not an integer clock')
end
if cursor and not to_clock(cursor) then
  return redis.error_reply('ROUTER_CORRUPT the subscriber cursor is not an integer clock')
end
if clock and cursor then
  return 0
end
if clock then
  redis.call('EXPIRE', KEYS[1], ttl)
else
  clock = '0'
  redis.call('SET', KEYS[1], clock, 'EX', ttl)
end
redis.call('SET', KEYS[2], clock, 'EX', ttl)
return 1
