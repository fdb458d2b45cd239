"""Run lua/job_submit.lua under Lua 5.1 (lupa) with a fake ``slurm`` table.

The fake behaves like job_submit_lua.c: ``job_desc`` is a proxy whose fields are read from and
written to a plain store; writing ``nil`` raises (luaL_checkstring), writing ``""`` to a string
field clears it. ``socket``/``socket.unix`` are a thin shim over *real* Unix sockets (so the hook
talks to a real daemon or a real misbehaving server), and ``cjson`` is backed by Python's json.
"""

from __future__ import annotations

import json
import socket as pysocket
import time
from pathlib import Path

import lupa.lua51 as lupa51

REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "slurm_gpushare" / "lua" / "job_submit.lua"

# String fields of job_desc (clearing with "" gives nil); others are numbers.
STRING_FIELDS = {
    "account", "admin_comment", "comment", "features", "exc_nodes", "name", "partition", "qos",
    "script", "tres_per_job", "tres_per_node", "tres_per_socket", "tres_per_task",
    "cpus_per_tres", "mem_per_tres", "user_name", "gres", "req_nodes", "reservation",
    "array_inx",
}
NO_VAL = 4294967294
NO_VAL16 = 65534


class FakeSocket:
    """The subset of a LuaSocket unix stream the hook uses, on a real socket."""

    def __init__(self):
        self.sock = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
        self.buffer = b""
        self.closed = False

    def settimeout(self, seconds):
        self.sock.settimeout(max(float(seconds), 0.0001))
        return 1

    def connect(self, path):
        try:
            self.sock.connect(path)
        except pysocket.timeout:
            return None, "timeout"
        except OSError as exc:
            return None, exc.strerror or str(exc)
        return 1

    def send(self, data):
        try:
            self.sock.sendall(data.encode() if isinstance(data, str) else data)
        except pysocket.timeout:
            return None, "timeout"
        except OSError:
            return None, "closed"
        return len(data)

    def receive(self, pattern="*l"):
        if isinstance(pattern, (int, float)):
            return self._receive_bytes(int(pattern))
        while b"\n" not in self.buffer:
            try:
                chunk = self.sock.recv(65536)
            except pysocket.timeout:
                return None, "timeout"
            except OSError:
                return None, "closed"
            if not chunk:
                return None, "closed"
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def _receive_bytes(self, count):
        """LuaSocket's receive(n): n bytes, or nil, err, partial when fewer came in time."""
        while len(self.buffer) < count:
            try:
                chunk = self.sock.recv(count - len(self.buffer))
            except (pysocket.timeout, BlockingIOError):
                partial, self.buffer = self.buffer, b""
                return None, "timeout", partial.decode("latin-1")
            except OSError:
                chunk = b""
            if not chunk:
                partial, self.buffer = self.buffer, b""
                return None, "closed", partial.decode("latin-1")
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data.decode("latin-1")

    def wait_readable(self, timeout):
        """socket.select({self}, nil, timeout): True when data (or end of stream) is there."""
        import select

        if self.buffer:
            return True
        ready, _, _ = select.select([self.sock], [], [], max(float(timeout), 0))
        return bool(ready)

    def close(self):
        self.closed = True
        self.sock.close()
        return 1


LUA_PRELUDE = r"""
local py_new_socket, py_gettime, py_encode, py_decode, py_log, py_store = ...
local function wrap(s)
  local obj = {}
  function obj:settimeout(t) return s.settimeout(t) end
  function obj:connect(p) return s.connect(p) end
  function obj:send(d) return s.send(d) end
  function obj:receive(p) return s.receive(p) end
  function obj:close() return s.close() end
  obj._s = s
  return obj
end
local function select(recvt, sendt, timeout)
  -- Only what the hook uses: one socket to read from.
  if recvt[1]._s.wait_readable(timeout) then return { recvt[1] }, {}, nil end
  return {}, {}, "timeout"
end
package.preload["socket"] = function() return { gettime = py_gettime, select = select } end
package.preload["socket.unix"] = function()
  return { stream = function() return wrap(py_new_socket()) end }
end
local null = setmetatable({}, { __tostring = function() return "null" end })
package.preload["cjson"] = function()
  return { encode = py_encode, decode = py_decode, null = null }
end

slurm = { SUCCESS = 0, ERROR = -1, log_info = function(fmt, ...) py_log("info", string.format(fmt, ...)) end,
          log_error = function(fmt, ...) py_log("error", string.format(fmt, ...)) end,
          log_debug = function(fmt, ...) end, log_user = function(fmt, ...) end }

-- job_desc proxy: reads and writes go to py_store, as the C plugin's __index/__newindex do.
function make_job_desc(strings)
  return setmetatable({}, {
    __index = function(_, k) return py_store.get(k) end,
    __newindex = function(_, k, v)
      if v == nil then error("bad argument #3 to '?' (string expected, got nil)") end
      if strings[k] then
        if type(v) ~= "string" and type(v) ~= "number" then error("string expected") end
        v = tostring(v)
        if v == "" then py_store.clear(k) else py_store.set(k, v) end
      else
        if type(v) ~= "number" then error("number expected") end
        py_store.set(k, v)
      end
    end,
  })
end
"""


class Store:
    def __init__(self, fields):
        self.fields = dict(fields)

    def get(self, key):
        return self.fields.get(key)

    def set(self, key, value):
        self.fields[key] = value

    def clear(self, key):
        self.fields.pop(key, None)


class Hook:
    """One loaded copy of the hook (module state persists between calls, as in slurmctld)."""

    def __init__(self, settings: dict | None = None, tmp_path: Path | None = None):
        self.lua = lupa51.LuaRuntime(unpack_returned_tuples=True)
        self.logs: list[tuple[str, str]] = []
        self.sockets: list[FakeSocket] = []
        self._store = None
        prelude = self.lua.execute(f"return function(...) {LUA_PRELUDE} end")
        store_proxy = self.lua.table(get=lambda k: self._store.get(k),
                                     set=lambda k, v: self._store.set(k, v),
                                     clear=lambda k: self._store.clear(k))
        prelude(self._new_socket, time.time, self._encode, self._decode,
                lambda level, msg: self.logs.append((level, msg)), store_proxy)
        self.strings = self.lua.table_from({name: True for name in STRING_FIELDS})
        if settings is not None:
            path = (tmp_path or Path("/tmp")) / "gpushare_hook_test.json"
            path.write_text(json.dumps(settings))
            self.lua.execute(f'os.getenv = function(n) if n == "GPUSHARE_HOOK_CONFIG" '
                             f'then return "{path}" end return nil end')
        self.lua.execute(f'dofile("{HOOK}")')
        self.g = self.lua.globals()

    def _new_socket(self):
        sock = FakeSocket()
        self.sockets.append(sock)
        return sock

    def _to_py(self, value):
        if lupa51.lua_type(value) == "table":
            if value == self.lua.eval('require("cjson").null'):
                return None
            keys = list(value.keys())
            if keys and all(isinstance(k, (int, float)) for k in keys):
                return [self._to_py(value[k]) for k in sorted(keys)]
            return {k: self._to_py(value[k]) for k in keys}
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    def _to_lua(self, value):
        if isinstance(value, dict):
            return self.lua.table_from({k: self._to_lua(v) for k, v in value.items()})
        if isinstance(value, list):
            return self.lua.table_from([self._to_lua(v) for v in value])
        if value is None:
            return self.lua.eval('require("cjson").null')
        return value

    def _encode(self, table):
        return json.dumps(self._to_py(table))

    def _decode(self, text):
        return self._to_lua(json.loads(text))

    def submit(self, fields: dict, part_list: dict | None = None, uid: int = 1000):
        """Call slurm_job_submit; returns (rc, fields after the call)."""
        self._store = Store(fields)
        job_desc = self.g.make_job_desc(self.strings)
        parts = self.lua.table_from({name: self.lua.table_from(p)
                                     for name, p in (part_list or {}).items()})
        rc = self.g.slurm_job_submit(job_desc, parts, uid)
        return rc, dict(self._store.fields)

    def modify(self, fields: dict, uid: int = 0, job_rec: dict | None = None):
        """``scontrol update``: ``fields`` are the update's (unset ones absent), ``job_rec``
        the job as slurmctld holds it (read-only)."""
        self._store = Store(fields)
        job_desc = self.g.make_job_desc(self.strings)
        rec = self.lua.table_from(job_rec or {})
        rc = self.g.slurm_job_modify(job_desc, rec, self.lua.table(), uid)
        return rc, dict(self._store.fields)

    def state(self) -> dict:
        return self._to_py(self.g.gpushare_hook_state())


def job_fields(**overrides) -> dict:
    """A job_desc as sbatch --gres=gpu:1 from uid 1000 delivers it to job_submit (22.05)."""
    fields = {
        "user_id": 1000, "user_name": "alice", "account": "physics", "partition": "gpu",
        "tres_per_node": "gres:gpu:1", "time_limit": 60, "min_nodes": NO_VAL,
        "max_nodes": NO_VAL, "num_tasks": NO_VAL, "shared": NO_VAL16,
        "script": "#!/bin/sh\n#SBATCH --gres=gpu:1\npython train.py --lr 0.1\n", "name": "train",
    }
    for key, value in overrides.items():
        if value is None:
            fields.pop(key, None)
        else:
            fields[key] = value
    return fields
