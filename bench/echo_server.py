#!/usr/bin/env python3
"""A minimal server on the daemon's socket pattern, for benchmarks: a thread per connection,
one JSON line in, one out, nothing decided (every job kept). What any out-of-process daemon
costs at the least (``bench/daemon_cost.py --echo``, ``bench/submit_latency.py --echo``).

    python bench/echo_server.py SOCKET [--tag]

``--tag``: the reply tags the kept job (``admin_comment``), as the daemon does, so that the
test cluster's check that the hook reaches its daemon (``wait_hook``) passes.
"""

import json
import socketserver
import subprocess
import sys

TAG = {"admin_comment": "gpushare:v1:keep:why=echo"}


def start(path, *, tag: bool = False, quiet: bool = False) -> subprocess.Popen:
    """This server as a process of its own, listening on ``path`` (a Unix socket)."""
    out = subprocess.DEVNULL if quiet else None
    return subprocess.Popen([sys.executable, __file__, str(path), *(["--tag"] if tag else [])],
                            stdout=out, stderr=out)


def main(argv) -> None:
    path, tag = argv[0], "--tag" in argv[1:]
    writes = TAG if tag else {}

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            for line in self.rfile:
                request = json.loads(line)
                self.wfile.write(json.dumps({
                    "v": 1, "ok": True, "rid": request.get("rid"),
                    "decision": {"action": "keep", "code": "echo", "writes": writes}}
                ).encode() + b"\n")
                self.wfile.flush()

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    Server(path, Handler).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
