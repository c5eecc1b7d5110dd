"""Cube agent: runs beside one cube server and carries out the transfer's commands.

Commands (HTTP JSON; see docs/contracts.md, "Cube internals"), modelled on Paddle Serving's
cube-agent (download / reload / enable / status):

Every ``POST`` needs the ``cube-control`` credential (``runtime.auth``: 401 otherwise)
unless the agent runs with ``--insecure-no-auth``; the agent presents it to its server.

- ``POST /download {"url", "md5", "version", "mode": "base"|"delta", "base_version",
  "dict_name"?, "wait"?}``: the URL must lie under a version root and the md5 be the one
  published beside the tar (``sources``: 400 before any connection otherwise; an agent
  built in-process without ``version_roots`` also takes local paths); downloads the shard tar through
  ``runtime.storage.download``, which verifies the md5 before the file is kept, then
  unpacks it safely into ``<work_dir>/<dict>/<version>/`` (a member escaping that
  directory, a link, a device file or a truncated tar is an error; nothing partial is
  left behind).
- ``POST /reload {"version", "wait"?}``: asks the server to ``bg_load_base`` (or
  ``bg_load_patch`` for a delta) the unpacked directory and polls the server's
  ``GET /status`` until the background slot holds that version ``loaded`` (or ``failed``).
- ``POST /enable {"version"}``: asks the server to ``enable`` (atomic switch); then
  removes unpacked versions other than the one served and the previous one.
- ``POST /bg_unload``: the transfer's abort; forwards to the server and marks pending
  steps ``aborted``.
- ``GET /status``: every step's state (``idle|running|done|failed|aborted``), version,
  error and duration (s), plus the last step (``{"step", "state", "error"}`` at the top
  level) and the server's own status.
- ``GET /metrics``: Prometheus text format (``runtime.metrics.cube.AgentMetrics``: each
  step's seconds, result and bytes).
- ``GET /healthz``, ``GET /readyz``: liveness and readiness (``runtime.web.wsgi``).

Download and reload run in a background thread (one step at a time): the command answers
``202`` while running, ``200`` when done, ``500`` with ``{"step", "error"}`` when failed.
``"wait": S`` makes the command block up to S seconds for the outcome (the transfer uses
this to avoid polling). Commands are idempotent: repeating a command for the version it
already completed answers ``200`` at once; a command for the version running answers
``202``; a different version while a step runs is ``409``. A download of a version already
downloaded with another md5 (the same version id built for another shard count: a
re-layout) is a new download, and it clears the finished ``reload``/``enable`` of that
version, so they load and switch the new files instead of answering ``200`` at once;
``enable`` switches whenever the server's background slot holds the version loaded, even
if the server already serves that version id (from another build).

HTTP: a Flask app served by ``runtime.web.wsgi`` (one process, threads): the agent's
state lives in memory and control traffic is a few requests per rollout.

Modules: ``steps`` (the step machine, ``AgentError``), ``tarsafe`` (checked unpacking),
``sources`` (the version roots and the published md5),
``commands`` (``Agent``: the commands and the state file), ``app`` (``create_app``, ``main``).
"""
from runtime.cube.agent.app import create_app, main
from runtime.cube.agent.commands import Agent
from runtime.cube.agent.steps import STEPS, AgentError, StepState
from runtime.cube.agent.tarsafe import check_tar_complete, dict_dir_of, safe_extract

__all__ = ["Agent", "AgentError", "STEPS", "StepState", "check_tar_complete", "create_app", "dict_dir_of",
           "main", "safe_extract"]
