"""Cube server: one shard of one dict, served over the binary data plane, controlled over HTTP.

Modules:
- ``lookups.py``: ``LookupServer``, the data plane (``--port``, default 8900), the protocol of
  ``runtime/cube/protocol.py``: per request one C call (``kernel.c``
  ``cube_view_lookup``, GIL released) into the served version's view
  (``runtime/cube/views.py``: a base inline table + the overlays of recent patches)
  writing straight into a preallocated reply buffer, one send. I/O mode
  (``--io-mode``): ``epoll`` (default) multiplexes every connection on one thread;
  ``threads`` runs a blocking loop per connection and pays for GIL hand-offs between
  them (the README's benchmarks give both).
- ``conn.py``: a data-plane connection's buffers and counters, and the answer to its
  requests (the hot path).
- ``sockets.py``: its socket helpers (non-blocking send, unread / unacknowledged bytes).
- ``versions.py``: ``current`` (served), ``prev`` (still answered when a request names
  it, so a client can finish a batch on one version across shards while a switch
  propagates; dropped when the next load begins) and the background slot; ``enable``
  swaps one reference; a patch is loaded as an overlay on the served base and merged
  into it in place when the next patch load begins (never a copy of the table).
  ``--data-dir``: the enabled chain of dict directories (base + patches) is recorded
  in ``<data-dir>/state.json``; a restarted server reloads and serves it, unless a dict of the chain is not this
  server's dict name, shard and ``--shard-num`` (a resize: it then starts empty, logged,
  and the transfer lays the version out for the new shard count). Loads check the same
  against the dict's meta, so a server never serves another layout.
- ``app.py``: HTTP control (``--http-port``, default 8901), as docs/contracts.md:
  ``GET /status``, ``POST /bg_load_base {"dir", "version"}``, ``POST /bg_load_patch
  {"dir", "version", "base_version"}`` (409 unless ``base_version`` is the served
  version), ``POST /enable {"version"}`` (409 unless the bg slot holds it, loaded; 200
  when it is already served), ``POST /bg_unload``, ``GET /healthz``, ``GET /metrics``
  (Prometheus).
- ``core.py``: ``CubeServer``, the three put together; ``run.py``: ``main``, the command.

Stopping (SIGTERM, ``main``): readiness (``GET /readyz`` on the HTTP port) turns false,
the data plane keeps answering for ``--prestop-seconds``, then accepts no new connection,
answers every request it has received (a frame partly received included) and closes each
connection once nothing on it is unanswered (``--grace-period-seconds`` at most; a client then
reconnects to another replica), stops the HTTP port (its requests in flight finish), and
the process exits 0.
"""
from runtime.cube.server.core import CubeServer
from runtime.cube.server.run import main

__all__ = ["CubeServer", "main"]
