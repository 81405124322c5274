-- Shared by the scripts that take a fixed set of keys (included with `--! include keys`, see
-- router/state/scripts.py). Lua has no rollback: a command that fails after a write leaves
-- the write in place, so a script checks its keys before it writes anything.
-- check_keys(kinds): nil when KEYS holds exactly #kinds distinct keys and each KEYS[i] whose
-- kinds[i] is a type name ('hash', 'zset', 'string') is missing or holds that type (false:
-- not checked); else the coded error message to reply with (ROUTER_INVALID for the wrong
-- number of keys or a key given twice, ROUTER_CORRUPT for a key holding another type).
local function check_keys(kinds)
  if #KEYS ~= #kinds then
    return 'ROUTER_INVALID the script takes ' .. #kinds .. ' keys, not ' .. #KEYS
  end
  for i = 1, #KEYS do
    for j = 1, i - 1 do
      if KEYS[i] == KEYS[j] then
        return 'ROUTER_INVALID a key is given twice'
      end
    end
    if kinds[i] then
      local found = redis.call('TYPE', KEYS[i])['ok']
      if found ~= 'none' and found ~= kinds[i] then
        return 'ROUTER_CORRUPT a key holds a ' .. found .. ', not a ' .. kinds[i]
      end
    end
  end
  return nil
end
