-- gpushare_tres.lua: TRES request strings as the slurm-gpushare hook reads and checks them.
--
-- Mirrors slurm_gpushare/tres.py and Slurm's own parsing in src/common/gres.c
-- (_get_next_gres): comma-separated tokens "[gres:|gres/]name[:type][:count]", or
-- "...[=count]" (23.02+ tres_per_task: "cpu=2,gres/gpu=1").
-- Slurm 22.05 clients send "gres:gpu:1", 23.11+ "gres/gpu:1", old tools a bare "gpu:1".
-- Lua 5.1: no integer type, no goto, no bit operations.

local M = {}

local SUFFIX = { [""] = 1, k = 1024, m = 1024 ^ 2, g = 1024 ^ 3, t = 1024 ^ 4 }

local function parse_count(text)
  local digits, suffix = string.match(text, "^(%d+)([kKmMgGtT]?)$")
  if not digits then return nil end
  return tonumber(digits) * SUFFIX[string.lower(suffix)]
end

-- Split a TRES string into tokens {prefix=, name=, type=, count=}.
-- Returns nil, message for a string Slurm would not accept; {} for nil or "".
function M.parse(tres)
  local tokens = {}
  if tres == nil or tres == "" then return tokens end
  if type(tres) ~= "string" then return nil, "not a string" end
  for raw in string.gmatch(tres, "[^,]+") do
    local prefix = ""
    if string.sub(raw, 1, 5) == "gres:" or string.sub(raw, 1, 5) == "gres/" then
      prefix, raw = string.sub(raw, 1, 5), string.sub(raw, 6)
    end
    -- 23.02+ writes an explicit count after "=" ("gres/gpu:a100=1", "cpu=2"), as
    -- slurm_get_next_tres (src/common/slurm_protocol_defs.c) reads it.
    local head, explicit = string.match(raw, "^(.*)=([^=]*)$")
    if head then raw = head end
    local parts = {}
    for part in string.gmatch(raw .. ":", "([^:]*):") do parts[#parts + 1] = part end
    local name = parts[1]
    if name == nil or name == "" then return nil, "empty name in " .. tres end
    if #parts > (head and 2 or 3) then return nil, "too many fields in " .. tres end
    local gtype, count = nil, 1
    if head then
      gtype, count = parts[2], parse_count(explicit)
      if not count then return nil, "bad count in " .. tres end
    elseif #parts == 3 then
      gtype, count = parts[2], parse_count(parts[3])
      if not count then return nil, "bad count in " .. tres end
    elseif #parts == 2 then
      local n = parse_count(parts[2])
      if n then count = n else gtype = parts[2] end
    end
    if gtype == "" then gtype = nil end
    tokens[#tokens + 1] = { prefix = prefix, name = name, type = gtype, count = count }
  end
  return tokens
end

-- True when any token of the given TRES strings names one of the gres in `names` (a set).
-- Varargs, not a list: unset fields are nil, and ipairs would stop at the first one.
function M.mentions(names, ...)
  for i = 1, select("#", ...) do
    local tres = select(i, ...)
    local tokens = M.parse(tres)
    if tokens == nil then
      -- Unparsable: let the daemon (or Slurm) judge it rather than guess here.
      if string.find(tres, "gpu", 1, true) then return true end
    else
      for _, token in ipairs(tokens) do
        if names[token.name] then return true end
      end
    end
  end
  return false
end

return M
