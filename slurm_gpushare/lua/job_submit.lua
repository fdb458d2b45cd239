-- job_submit.lua: the slurm-gpushare hook (Slurm job_submit/lua, Lua 5.1).
--
-- For each GPU job it asks the local predictor daemon (Unix socket, one JSON line each way)
-- whether to keep the job as submitted or turn its whole GPU into a gres/shard share, then
-- writes the decision into job_desc. It FAILS OPEN: a missing, slow, hung or confused daemon,
-- or any error here, leaves the job exactly as submitted and accepted, with one log line.
--
-- Why the shape below:
--  * A Lua runtime error in job_submit accepts the job with whatever was already written
--    (job_submit_lua.c through 25.11), so the decision is fetched and validated completely
--    first, and all fields are written together at the end.
--  * The script runs under slurmctld's locks, one submission at a time: one connection is kept
--    across calls, every socket operation has a deadline, and a circuit breaker stops asking
--    a failing daemon for a while so a burst of submissions is not slowed by timeouts.
--  * Module-level state persists between calls; the file is re-read when its mtime changes.
--
-- Settings come from gpushare_hook.json beside this file (or $GPUSHARE_HOOK_CONFIG), written by
-- `slurm-gpushare hook-config`. The TRES helper module gpushare_tres.lua must sit beside it.

local HOOK_DIR = string.match(debug.getinfo(1, "S").source, "^@(.*/)") or "./"
package.path = HOOK_DIR .. "?.lua;" .. package.path

local tres = require("gpushare_tres")
local has_socket, socket = pcall(require, "socket")
local has_unix, unix = pcall(require, "socket.unix")
local has_json, cjson = pcall(require, "cjson")

local PROTOCOL_VERSION = 1
local NO_VAL16 = 65534 -- Slurm's "unset" for 16-bit fields; 32-bit ones use 4294967294
local GPU = { gpu = true }
local SHARED = { shard = true, mps = true }

local settings = {
  socket = "/run/slurm-gpushare/daemon.sock",
  timeout_ms = 50,
  breaker_failures = 3,
  breaker_cooldown_s = 30,
  max_script_bytes = 65536,
}

local function load_settings()
  local path = os.getenv("GPUSHARE_HOOK_CONFIG") or (HOOK_DIR .. "gpushare_hook.json")
  local file = io.open(path, "r")
  if not file then return end
  local text = file:read("*a")
  file:close()
  local ok, parsed = pcall(cjson.decode, text)
  if not ok or type(parsed) ~= "table" then
    slurm.log_error("gpushare: ignoring unreadable %s", path)
    return
  end
  for key, default in pairs(settings) do
    if type(parsed[key]) == type(default) then settings[key] = parsed[key] end
  end
end

if has_json then load_settings() end

-- Connection and circuit-breaker state (persists between submissions).
local conn = nil
local failures = 0
local open_until = 0
local request_id = 0
local counters = { asked = 0, shared = 0, kept = 0, failed = 0, skipped = 0 }

-- Scripts resubmitted unchanged (arrays, sweeps) travel once: afterwards the hook sends the
-- keyed digest the daemon returned for them. Bounded; forgotten with the connection (a
-- restarted daemon may hold another secret).
local MAX_DIGESTS = 1024
local digest_of, digests_held = {}, 0

local function drop_connection()
  if conn then pcall(conn.close, conn) end
  conn = nil
  digest_of, digests_held = {}, 0
end

local function remember_digest(script, digest)
  if type(script) ~= "string" or type(digest) ~= "string" or #digest ~= 64
      or not string.find(digest, "^%x+$") then
    return
  end
  if digests_held >= MAX_DIGESTS then digest_of, digests_held = {}, 0 end
  if digest_of[script] == nil then digests_held = digests_held + 1 end
  digest_of[script] = digest
end

-- One round trip with a deadline over connect + send + receive. Returns reply table or nil, err.
local function ask_daemon(message)
  local deadline = socket.gettime() + settings.timeout_ms / 1000
  local function remaining()
    local left = deadline - socket.gettime()
    if left <= 0 then return nil end
    return left
  end
  local line = cjson.encode(message) .. "\n"
  for attempt = 1, 2 do
    local fresh = false
    if conn == nil then
      local c = unix.stream and unix.stream() or unix()
      c:settimeout(remaining() or 0)
      local ok, err = c:connect(settings.socket)
      if not ok then
        pcall(c.close, c)
        return nil, "connect: " .. tostring(err)
      end
      conn, fresh = c, true
    end
    local left = remaining()
    if not left then drop_connection(); return nil, "timeout" end
    conn:settimeout(left)
    local sent, err = conn:send(line)
    if sent then
      left = remaining()
      if not left then drop_connection(); return nil, "timeout" end
      conn:settimeout(left)
      local reply
      reply, err = conn:receive("*l")
      if reply then return reply end
    end
    drop_connection()
    -- A kept connection may have been closed by the daemon (restart, idle timeout): retry
    -- once on a fresh one. A timeout is never retried: the deadline is spent.
    if fresh or err == "timeout" then return nil, tostring(err) end
  end
  return nil, "closed"
end

local function default_partition(part_list)
  if type(part_list) ~= "table" then return nil end
  for name, part in pairs(part_list) do
    if part.flag_default == 1 then return name end
  end
  return nil
end

local function read_request(job_desc, part_list, submit_uid)
  local script = job_desc.script
  if type(script) == "string" and #script > settings.max_script_bytes then
    script = string.sub(script, 1, settings.max_script_bytes)
  end
  local script_digest = script and digest_of[script]
  if script_digest then script = nil end
  return {
    uid = job_desc.user_id,
    user = job_desc.user_name,
    account = job_desc.account,
    partition = job_desc.partition or default_partition(part_list),
    qos = job_desc.qos,
    tres_per_job = job_desc.tres_per_job,
    tres_per_node = job_desc.tres_per_node,
    tres_per_socket = job_desc.tres_per_socket,
    tres_per_task = job_desc.tres_per_task,
    cpus_per_tres = job_desc.cpus_per_tres,
    mem_per_tres = job_desc.mem_per_tres,
    ntasks_per_tres = job_desc.ntasks_per_tres,
    features = job_desc.features,
    exc_nodes = job_desc.exc_nodes,
    time_limit = job_desc.time_limit,
    min_nodes = job_desc.min_nodes,
    max_nodes = job_desc.max_nodes,
    num_tasks = job_desc.num_tasks,
    shared = job_desc.shared,
    -- Sent only to be digested (keyed hash) or scanned for opt-out/hint tokens; never stored.
    script = script,
    script_digest = script_digest,
    name = job_desc.name,
    comment = job_desc.comment,
  }
end

-- Fields the daemon may ask us to write, and the characters their values may contain.
local WRITABLE = {
  { "tres_per_job", "^[%w_:/,.%-]*$" },
  { "tres_per_node", "^[%w_:/,.%-]*$" },
  { "features", "^[%w_&|()%[%]*,.%-]*$" },
  { "exc_nodes", "^[%w_,%[%]%-]*$" },
  { "admin_comment", "^gpushare:v%d+:[%w_:=+.,%-]*$" },
}

-- Check a reply completely before anything is written. Returns decision or nil, why.
local function validate(reply, request)
  if type(reply) ~= "table" or reply.v ~= PROTOCOL_VERSION then return nil, "bad reply version" end
  if reply.rid ~= request.rid then return nil, "reply for another request" end
  if reply.ok ~= true then return nil, "daemon error: " .. tostring(reply.error) end
  local decision = reply.decision
  if type(decision) ~= "table" then return nil, "reply without decision" end
  if decision.action ~= "keep" and decision.action ~= "share" then return nil, "unknown action" end
  local writes = decision.writes
  if writes == nil or writes == cjson.null then writes = {} end
  if type(writes) ~= "table" then return nil, "bad writes" end
  local count = 0
  for name, value in pairs(writes) do
    local pattern
    for _, entry in ipairs(WRITABLE) do
      if entry[1] == name then pattern = entry[2] end
    end
    if not pattern then return nil, "unwritable field " .. tostring(name) end
    if type(value) ~= "string" or not string.match(value, pattern) then
      return nil, "bad value for " .. name
    end
    count = count + 1
  end
  decision.writes = writes
  if decision.action == "keep" then
    -- A kept job may only be tagged (so its telemetry becomes history), never changed.
    if count > (writes.admin_comment and 1 or 0) then return nil, "keep that changes the job" end
    return decision
  end
  -- The share itself must be a parsable shard/mps request and no GPU may remain.
  local node_tokens = tres.parse(writes.tres_per_node)
  if not node_tokens or not tres.mentions(SHARED, writes.tres_per_node) then
    return nil, "share without shard/mps in tres_per_node"
  end
  if tres.mentions(GPU, writes.tres_per_node, writes.tres_per_job or request.job.tres_per_job) then
    return nil, "share that still asks for a whole GPU"
  end
  -- Never turn jobs Slurm cannot share into shares, whatever the daemon says.
  -- (shared 0/2/3 = --exclusive[=user|mcs]; unset numbers arrive as NO_VAL markers.)
  local shared, min_nodes = request.job.shared, request.job.min_nodes
  local exclusive = shared ~= nil and shared < NO_VAL16 and shared ~= 1
  if exclusive or (min_nodes ~= nil and min_nodes > 1 and min_nodes < 4294967294) then
    return nil, "share for an exclusive or multi-node job"
  end
  return decision
end

local function record_failure(uid, why)
  failures = failures + 1
  counters.failed = counters.failed + 1
  local note = ""
  if failures >= settings.breaker_failures then
    open_until = socket.gettime() + settings.breaker_cooldown_s
    note = string.format("; not asking for %ds", settings.breaker_cooldown_s)
  end
  slurm.log_info("gpushare: job left as submitted (uid %s): %s%s", tostring(uid), why, note)
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local ok, err = pcall(function()
    if not (has_socket and has_unix and has_json) then
      -- Checked per call so the reason shows up in the log where admins look.
      slurm.log_info("gpushare: job left as submitted: lua-socket or lua-cjson missing")
      return
    end
    if not tres.mentions(GPU, job_desc.tres_per_node, job_desc.tres_per_job,
                         job_desc.tres_per_socket, job_desc.tres_per_task) then
      return
    end
    if open_until > 0 then
      if socket.gettime() < open_until then
        counters.skipped = counters.skipped + 1
        slurm.log_info("gpushare: job left as submitted (uid %s): daemon unavailable (breaker open)",
                       tostring(job_desc.user_id))
        return
      end
      open_until = 0 -- half-open: this call is the probe
    end

    request_id = request_id + 1
    local request = { v = PROTOCOL_VERSION, op = "decide", rid = request_id,
                      job = read_request(job_desc, part_list, submit_uid) }
    counters.asked = counters.asked + 1
    local line, why = ask_daemon(request)
    local uid = job_desc.user_id
    if not line then return record_failure(uid, why) end
    local parsed_ok, reply = pcall(cjson.decode, line)
    if not parsed_ok then drop_connection(); return record_failure(uid, "unreadable reply") end
    local decision
    decision, why = validate(reply, request)
    if not decision then drop_connection(); return record_failure(uid, why) end
    failures = 0
    remember_digest(request.job.script, reply.script_digest)

    -- All checks passed: write every field now, in one go.
    for _, entry in ipairs(WRITABLE) do
      local value = decision.writes[entry[1]]
      if value ~= nil then job_desc[entry[1]] = value end
    end
    if decision.action == "keep" then
      counters.kept = counters.kept + 1
    else
      counters.shared = counters.shared + 1
      slurm.log_info("gpushare: uid %s: %s", tostring(job_desc.user_id),
                     tostring(decision.writes.admin_comment))
    end
  end)
  if not ok then
    -- An error before the write loop leaves the job untouched; the loop itself only assigns
    -- validated strings. Either way the job is accepted.
    slurm.log_error("gpushare: job left as submitted: hook error: %s", tostring(err))
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  -- `scontrol update` goes through untouched: a running share is not re-decided.
  return slurm.SUCCESS
end

-- For tests and `slurm-gpushare check-config`: the hook's own view of itself.
function gpushare_hook_state()
  return { settings = settings, failures = failures, open_until = open_until,
           counters = counters, connected = conn ~= nil, digests_held = digests_held }
end
