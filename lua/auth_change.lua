-- Change the cluster's users or ACL rules, and count the change: nodes read the users and
-- rules again when the count moves (router/state/auth_store.py).
-- KEYS[1] = the users hash (user name -> the user's record, packed by the caller)
-- KEYS[2] = the ACL rules list (rule lines in the ACL file format, tried in order)
-- KEYS[3] = the change count (a string holding an integer)
-- ARGV[1] = the change, followed by its arguments:
--   'user_add', name, record, replace ('0' or '1'): 1 if written, 0 if the user exists
--     and replace is '0' (nothing written)
--   'user_password', name, hash: the user's new password hash (its flag kept); 1 if
--     written, 0 if there is no such user (nothing written)
--   'user_remove', name: 1 if removed, 0 if there was no such user
--   'acl_insert', position, line: the position the rule took (1-based); position 0 puts
--     it last, n >= 1 before the rule at n (or last, if there are fewer)
--   'acl_remove', line: the position the first rule equal to line had, 0 if none
-- The count moves only when something was written.
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_CORRUPT (a key of another type, a
-- change count that is not an integer)
--! include keys

local wrong_keys = check_keys({'hash', 'list', 'string'})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

local users, rules, count = KEYS[1], KEYS[2], KEYS[3]
local counted = redis.call('GET', count)
if counted and (not string.match(counted, '^[0-9]+$') or #counted > 15) then
  return redis.error_reply('ROUTER_CORRUPT the change count is not a small integer')
end
local change = ARGV[1]
local result = 0

local function needs(n)
  if #ARGV ~= n + 1 or ARGV[2] == '' then
    return redis.error_reply('ROUTER_INVALID auth_change ' .. tostring(change) .. ' takes '
      .. n .. ' arguments')
  end
  return nil
end

if change == 'user_add' then
  local bad = needs(3)
  if bad then return bad end
  if ARGV[4] == '1' then
    redis.call('HSET', users, ARGV[2], ARGV[3])
    result = 1
  else
    result = redis.call('HSETNX', users, ARGV[2], ARGV[3])
  end
elseif change == 'user_password' then
  local bad = needs(2)
  if bad then return bad end
  local held = redis.call('HGET', users, ARGV[2])
  if held then
    redis.call('HSET', users, ARGV[2], string.sub(held, 1, 1) .. ' ' .. ARGV[3])
    result = 1
  end
elseif change == 'user_remove' then
  local bad = needs(1)
  if bad then return bad end
  result = redis.call('HDEL', users, ARGV[2])
elseif change == 'acl_insert' then
  local bad = needs(2)
  if bad then return bad end
  if not string.match(ARGV[2], '^[0-9]+$') or #ARGV[2] > 9 then
    return redis.error_reply('ROUTER_INVALID the position must be an integer >= 0')
  end
  local position = tonumber(ARGV[2])
  local length = redis.call('LLEN', rules)
  if position == 0 or position > length then
    result = redis.call('RPUSH', rules, ARGV[3])
  else
    local held = redis.call('LRANGE', rules, position - 1, -1)
    if position == 1 then
      redis.call('DEL', rules)
    else
      redis.call('LTRIM', rules, 0, position - 2)
    end
    redis.call('RPUSH', rules, ARGV[3])
    for i = 1, #held, 1000 do
      redis.call('RPUSH', rules, unpack(held, i, math.min(i + 999, #held)))
    end
    result = position
  end
elseif change == 'acl_remove' then
  local bad = needs(1)
  if bad then return bad end
  local held = redis.call('LRANGE', rules, 0, -1)
  for i = 1, #held do
    if held[i] == ARGV[2] then
      redis.call('LSET', rules, i - 1, '\0removed')
      redis.call('LREM', rules, 1, '\0removed')
      result = i
      break
    end
  end
else
  return redis.error_reply('ROUTER_INVALID unknown change ' .. tostring(change))
end

if result ~= 0 then
  redis.call('INCR', count)
end
return result
