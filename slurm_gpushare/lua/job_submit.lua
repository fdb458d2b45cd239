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
local NO_VAL = 4294967294
-- job_desc.nice carries NICE_OFFSET (slurm.h: 0x80000000): sbatch --nice=n sends NICE_OFFSET + n,
-- an unset nice arrives as NO_VAL (job_mgr.c turns it into NICE_OFFSET after this plugin ran).
local NICE_OFFSET = 2147483648
local MAX_NICE = 1000000 -- the most the daemon may move a job either way (core/config.py)
local GPU = { gpu = true }
local SHARED = { shard = true, mps = true }

local settings = {
  socket = "/run/slurm-gpushare/daemon.sock",
  timeout_ms = 50,
  breaker_failures = 3,
  breaker_cooldown_s = 30,
  breaker_first_cooldown_s = 1,
  breaker_window = 20,
  breaker_failure_rate = 0.5,
  breaker_slow_ms = 20,
  max_script_bytes = 65536,
  max_reply_bytes = 65536,
  max_share_count = 100,
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
-- The breaker's cooldown: breaker_first_cooldown_s when it opens, doubled (up to
-- breaker_cooldown_s) each time it opens again soon after it last closed or on a failed
-- probe. A daemon restart (no socket for a few seconds) costs about the first cooldown; a
-- daemon that keeps failing is asked ever less often, as with one long cooldown.
local cooldown_s = 0
local probing = false -- this call is the probe after a cooldown
local closed_at = nil -- when a probe last succeeded
local request_id = 0
local counters = { asked = 0, shared = 0, kept = 0, failed = 0, skipped = 0, refused = 0 }
-- The last breaker_window round trips: { failed = bool, latency = seconds } (a ring).
local window = {}
local window_next = 1

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

-- Read one reply line of at most max_reply_bytes before the deadline. Reads what is there
-- (non-blocking) and waits with select, so neither a huge nor a trickled reply can hold
-- slurmctld past the deadline or grow the Lua heap past the cap. Returns line or nil, err.
local function receive_line(remaining)
  local parts, size = {}, 0
  conn:settimeout(0)
  while true do
    local data, err, partial = conn:receive(8192)
    local got = data or partial
    if got and #got > 0 then
      local newline = string.find(got, "\n", 1, true)
      if newline then
        parts[#parts + 1] = string.sub(got, 1, newline - 1)
        -- One reply per request: bytes after it belong to no request we made.
        if newline < #got then drop_connection() end
        return table.concat(parts)
      end
      size = size + #got
      if size > settings.max_reply_bytes then return nil, "reply too large" end
      parts[#parts + 1] = got
    end
    if err and err ~= "timeout" then return nil, tostring(err) end
    if not data then
      local left = remaining()
      if not left then return nil, "timeout" end
      local readable, _, select_err = socket.select({ conn }, nil, left)
      if select_err == "timeout" or not readable or #readable == 0 then return nil, "timeout" end
    end
  end
end

-- One round trip with a deadline over connect + send + receive. Returns reply table or nil, err.
local function ask_daemon(message)
  local deadline = socket.gettime() + settings.timeout_ms / 1000
  -- The daemon decides nothing for a request it reads after this (it sat in the backlog of
  -- a stopped daemon): the job went through as submitted.
  message.deadline = deadline
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
      local reply
      reply, err = receive_line(remaining)
      if reply then return reply end
    end
    drop_connection()
    -- A kept connection may have been closed by the daemon (restart, idle timeout): retry
    -- once on a fresh one. Nothing else is retried (a timeout has spent the deadline).
    if fresh or err ~= "closed" then return nil, tostring(err) end
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

-- The script's argv (job_desc.argv is a table indexed from 0), bounded like the script.
local function read_argv(job_desc)
  local argv = job_desc.argv
  if type(argv) ~= "table" then return nil end
  local out, size = {}, 0
  for i = 0, 255 do
    local arg = argv[i]
    if type(arg) ~= "string" then break end
    size = size + #arg
    if size > settings.max_script_bytes then break end
    out[#out + 1] = arg
  end
  if #out == 0 then return nil end
  return out
end

local function read_request(job_desc, part_list, submit_uid, gpu_fields)
  local script = job_desc.script
  -- job_desc.script is set for sbatch only; srun and salloc allocations carry none.
  local batch = type(script) == "string" and #script > 0
  if type(script) == "string" and #script > settings.max_script_bytes then
    script = string.sub(script, 1, settings.max_script_bytes)
  end
  local het_offset = job_desc.het_job_offset
  if type(het_offset) ~= "number" or het_offset >= 4294967294 then het_offset = nil end
  local script_digest = script and digest_of[script]
  if script_digest then script = nil end
  return {
    uid = job_desc.user_id,
    user = job_desc.user_name,
    account = job_desc.account,
    partition = job_desc.partition or default_partition(part_list),
    qos = job_desc.qos,
    tres_per_job = gpu_fields.tres_per_job,
    tres_per_node = gpu_fields.tres_per_node,
    tres_per_socket = gpu_fields.tres_per_socket,
    tres_per_task = gpu_fields.tres_per_task,
    cpus_per_tres = job_desc.cpus_per_tres,
    mem_per_tres = job_desc.mem_per_tres,
    ntasks_per_tres = job_desc.ntasks_per_tres,
    tres_freq = job_desc.tres_freq,
    features = job_desc.features,
    prefer = job_desc.prefer,
    exc_nodes = job_desc.exc_nodes,
    req_nodes = job_desc.req_nodes,
    reservation = job_desc.reservation,
    array_inx = job_desc.array_inx,
    het_job_offset = het_offset,
    batch = batch,
    time_limit = job_desc.time_limit,
    min_nodes = job_desc.min_nodes,
    max_nodes = job_desc.max_nodes,
    num_tasks = job_desc.num_tasks,
    shared = job_desc.shared,
    -- Sent only to be digested (keyed hash) or scanned for opt-out/hint tokens; never stored.
    script = script,
    argv = read_argv(job_desc),
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
  { "nice", "^%-?%d+$" },
}
local WRITABLE_PATTERN = {}
for _, entry in ipairs(WRITABLE) do WRITABLE_PATTERN[entry[1]] = entry[2] end
-- A kept job may be tagged and reordered (nice), never changed otherwise.
local KEEP_WRITABLE = { admin_comment = true, nice = true }

-- The job's nice after the daemon's adjustment: added to the user's own --nice, if any.
-- (The permission check for a negative nice ran before job_submit, in job_mgr.c, so the
-- adjustment may lower it; it never goes below NICE_OFFSET - MAX_NICE.)
local function adjusted_nice(current, adjustment)
  local base = NICE_OFFSET
  if type(current) == "number" and current > 0 and current < NO_VAL then base = current end
  local value = base + adjustment
  if value < NICE_OFFSET - MAX_NICE then value = NICE_OFFSET - MAX_NICE end
  if value > NICE_OFFSET + MAX_NICE then value = NICE_OFFSET + MAX_NICE end
  return value
end

-- A node count that asks for more than one node (unset counts arrive as NO_VAL).
local function several_nodes(count)
  return type(count) == "number" and count > 1 and count < NO_VAL
end

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
  for name, value in pairs(writes) do
    local pattern = WRITABLE_PATTERN[name]
    if not pattern then return nil, "unwritable field " .. tostring(name) end
    if type(value) ~= "string" or not string.match(value, pattern) then
      return nil, "bad value for " .. name
    end
    if name == "nice" and math.abs(tonumber(value)) > MAX_NICE then
      return nil, "nice out of range"
    end
    if decision.action == "keep" and not KEEP_WRITABLE[name] then
      return nil, "keep that changes the job"
    end
  end
  decision.writes = writes
  if decision.action == "keep" then
    -- A kept job may only be tagged (so its telemetry becomes history) and reordered.
    return decision
  end
  -- The share itself must be a parsable shard/mps request and no GPU may remain.
  local node_tokens = tres.parse(writes.tres_per_node)
  local shares, whole = 0, false
  for _, token in ipairs(node_tokens or {}) do
    if SHARED[token.name] then
      -- A count of 0 would silently drop the job's GPU; one above a GPU's capacity never runs.
      if token.count < 1 or token.count > settings.max_share_count then
        return nil, "share count out of range"
      end
      shares = shares + 1
    elseif GPU[token.name] then
      whole = true
    end
  end
  if shares == 0 then return nil, "share without shard/mps in tres_per_node" end
  -- A share always carries its tag: without it its telemetry, reports and requeue are blind.
  if type(writes.admin_comment) ~= "string"
      or not string.match(writes.admin_comment, "^gpushare:v%d+:share:") then
    return nil, "share without its tag"
  end
  if whole or tres.mentions(GPU, writes.tres_per_job or request.job.tres_per_job) then
    return nil, "share that still asks for a whole GPU"
  end
  -- Never turn jobs Slurm cannot share into shares, whatever the daemon says.
  -- (shared 0/2/3 = --exclusive[=user|mcs]; unset numbers arrive as NO_VAL markers.)
  local job = request.job
  local exclusive = job.shared ~= nil and job.shared < NO_VAL16 and job.shared ~= 1
  if exclusive or several_nodes(job.min_nodes) or several_nodes(job.max_nodes) then
    return nil, "share for an exclusive or multi-node job"
  end
  -- Slurm refuses a shared gres next to a GPU frequency (--gpu-freq): the job would be rejected.
  if type(job.tres_freq) == "string" and string.find(job.tres_freq, "gpu", 1, true) then
    return nil, "share for a job with --gpu-freq"
  end
  -- Slurm tries --prefer features in place of the job's constraint: the share's types would
  -- not hold (and where the preferred nodes have no shards, the job is refused).
  if type(job.prefer) == "string" and job.prefer ~= "" then
    return nil, "share for a job with --prefer"
  end
  return decision
end

local function open_breaker(why)
  local now = socket.gettime()
  local again = probing or (closed_at ~= nil and now - closed_at < settings.breaker_cooldown_s)
  if again and cooldown_s > 0 then
    cooldown_s = math.min(cooldown_s * 2, settings.breaker_cooldown_s)
  else
    cooldown_s = math.min(settings.breaker_first_cooldown_s, settings.breaker_cooldown_s)
  end
  probing = false
  open_until = now + cooldown_s
  window, window_next = {}, 1
  return string.format("; %s: not asking for %gs", why, cooldown_s)
end

-- The daemon answered (whatever it decided): a probe that gets an answer closes the breaker.
local function answered()
  failures = 0
  if probing then
    probing, closed_at = false, socket.gettime()
  end
end

-- Record one round trip in the sliding window; returns a note if the breaker opened.
-- Only the daemon's health is recorded here, never a job refused for its own request.
local function observe(failed, latency)
  window[window_next] = { failed = failed, latency = latency }
  window_next = window_next % settings.breaker_window + 1
  if #window < settings.breaker_window then return "" end
  local failed_count, total_latency = 0, 0
  for _, entry in ipairs(window) do
    if entry.failed then failed_count = failed_count + 1 end
    total_latency = total_latency + entry.latency
  end
  if failed_count >= settings.breaker_failure_rate * #window then
    return open_breaker(string.format("%d of the last %d asks failed", failed_count, #window))
  end
  local mean_ms = total_latency / #window * 1000
  if mean_ms > settings.breaker_slow_ms then
    return open_breaker(string.format("daemon slow (%.1f ms on average)", mean_ms))
  end
  return ""
end

-- The daemon is unhealthy this time: timeout, connection error, unreadable reply.
local function record_failure(uid, why, latency)
  failures = failures + 1
  counters.failed = counters.failed + 1
  local note = observe(true, latency)
  if note == "" and probing then
    note = open_breaker("the probe after the cooldown failed")
  elseif note == "" and failures >= settings.breaker_failures then
    note = open_breaker(string.format("%d failures in a row", failures))
  end
  slurm.log_info("gpushare: job left as submitted (uid %s): %s%s", tostring(uid), why, note)
end

-- The daemon answered, but this job's decision is refused: the job stays as submitted and the
-- daemon's health is not in question (users can provoke refusals; they must not be able to
-- switch sharing off for everyone).
local function record_refusal(uid, why, latency)
  answered()
  counters.refused = counters.refused + 1
  local note = observe(false, latency)
  slurm.log_info("gpushare: job left as submitted (uid %s): %s%s", tostring(uid), why, note)
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local ok, err = pcall(function()
    if not (has_socket and has_unix and has_json) then
      -- Checked per call so the reason shows up in the log where admins look.
      slurm.log_info("gpushare: job left as submitted: lua-socket or lua-cjson missing")
      return
    end
    -- Every read of a job_desc field is a lookup in slurmctld's C accessor: each is read once.
    local gpu_fields = { tres_per_node = job_desc.tres_per_node,
                         tres_per_job = job_desc.tres_per_job,
                         tres_per_socket = job_desc.tres_per_socket,
                         tres_per_task = job_desc.tres_per_task }
    if not tres.mentions(GPU, gpu_fields.tres_per_node, gpu_fields.tres_per_job,
                         gpu_fields.tres_per_socket, gpu_fields.tres_per_task) then
      return
    end
    if open_until > 0 then
      if socket.gettime() < open_until then
        counters.skipped = counters.skipped + 1
        slurm.log_info("gpushare: job left as submitted (uid %s): daemon unavailable (breaker open)",
                       tostring(job_desc.user_id))
        return
      end
      open_until, probing = 0, true -- half-open: this call is the probe
    end

    request_id = request_id + 1
    -- brief: the decision without its reason and details (what is read below, no more).
    local request = { v = PROTOCOL_VERSION, op = "decide", rid = request_id, brief = true,
                      job = read_request(job_desc, part_list, submit_uid, gpu_fields) }
    counters.asked = counters.asked + 1
    local started = socket.gettime()
    local line, why = ask_daemon(request)
    local latency = socket.gettime() - started
    local uid = request.job.uid
    if not line then return record_failure(uid, why, latency) end
    local parsed_ok, reply = pcall(cjson.decode, line)
    if not parsed_ok or type(reply) ~= "table" or reply.v ~= PROTOCOL_VERSION
        or reply.rid ~= request.rid then
      drop_connection()
      return record_failure(uid, "unreadable reply", latency)
    end
    local decision
    decision, why = validate(reply, request)
    if not decision then return record_refusal(uid, why, latency) end
    answered()
    local note = observe(false, latency)
    if note ~= "" then slurm.log_info("gpushare: breaker open%s", note) end
    remember_digest(request.job.script, reply.script_digest)

    -- All checks passed: write every field now, in one go.
    local nice
    if decision.writes.nice ~= nil then
      nice = adjusted_nice(job_desc.nice, tonumber(decision.writes.nice))
    end
    for _, entry in ipairs(WRITABLE) do
      local value = decision.writes[entry[1]]
      if entry[1] == "nice" then value = nice end
      if value ~= nil then job_desc[entry[1]] = value end
    end
    if decision.action == "keep" then
      counters.kept = counters.kept + 1
    else
      counters.shared = counters.shared + 1
      slurm.log_info("gpushare: uid %s: %s", tostring(uid),
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

-- Update fields a share's decision rests on (its partition, its GPU request, its constraint,
-- its node lists).
local DECIDING_FIELDS = { "partition", "tres_per_job", "tres_per_node", "tres_per_socket",
                          "tres_per_task", "features", "req_nodes", "exc_nodes" }

-- `scontrol update` of a job that was turned into a share: an update of a field the decision
-- rests on is refused, with the reason, because 22.05 cannot apply it consistently: a pending
-- job's gres list keeps its shard/mps entry, so a GPU update is either rejected ("Invalid
-- generic resource") or, spelled gres/gpu, shown but not used (sacct AllocTRES still has the
-- shard); a move to a partition where sharing is off, or new features or node lists, would run
-- the share where it was never decided. Every other update, and every update of other jobs,
-- goes through untouched. Any error here lets the update through, as Slurm alone would.
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  local ok, changed = pcall(function()
    local tag = job_rec and job_rec.admin_comment
    if type(tag) ~= "string" or not string.match(tag, "^gpushare:v%d+:share:") then return nil end
    -- An update that writes a new tag is the daemon's own re-decision (only operators and
    -- SlurmUser can set AdminComment): the requeue of a share that outgrew its memory.
    local new_tag = job_desc.admin_comment
    if type(new_tag) == "string" and string.match(new_tag, "^gpushare:v%d+:") then return nil end
    local names = {}
    for _, name in ipairs(DECIDING_FIELDS) do
      if job_desc[name] ~= nil then names[#names + 1] = name end
    end
    if #names == 0 then return nil end
    return table.concat(names, ",")
  end)
  if ok and changed then
    local job_id = tostring(job_rec.job_id)
    slurm.log_user("gpushare: job %s runs as a GPU share; changing %s would leave it " ..
                   "inconsistent. Cancel it and resubmit (with --comment gpushare=off for a " ..
                   "whole GPU).", job_id, changed)
    slurm.log_info("gpushare: update of share job %s refused (uid %s): %s", job_id,
                   tostring(modify_uid), changed)
    return slurm.ERROR
  end
  if not ok then
    slurm.log_error("gpushare: update let through: hook error: %s", tostring(changed))
  end
  return slurm.SUCCESS
end

-- For tests and `slurm-gpushare check-config`: the hook's own view of itself.
function gpushare_hook_state()
  return { settings = settings, failures = failures, open_until = open_until,
           counters = counters, connected = conn ~= nil, window = #window,
           cooldown_s = cooldown_s,
           digests_held = digests_held }
end
