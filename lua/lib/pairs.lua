-- Shared by the scripts that store subscriptions (included with `--! include pairs`, see
-- router/state/scripts.py).
-- check_pairs(first): nil when ARGV[first], ARGV[first + 1], ... (an even count, checked by
-- the caller) are filter / packed options pairs: a filter of 1..65535 bytes and options that
-- are not empty; else the ROUTER_INVALID error message to reply with.
local function check_pairs(first)
  for i = first, #ARGV, 2 do
    if #ARGV[i] == 0 or #ARGV[i] > 65535 then
      return 'ROUTER_INVALID a filter must be 1..65535 bytes'
    end
    if #ARGV[i + 1] == 0 then
      return 'ROUTER_INVALID packed options must not be empty'
    end
  end
  return nil
end
