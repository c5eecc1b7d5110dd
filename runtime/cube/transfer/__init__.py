"""Cube transfer: watches the donefiles and rolls every new version out to all shards x
replicas with barriers, so all serve one version (Paddle Serving's cube-transfer, run
continuously with its HTTP API kept).

- ``state``: the persisted state (typed records, atomic writes);
- ``planner``: what to roll out next, and each outcome's effect on the state (pure);
- ``build``: Building and Deploying (builder, publishing the shard tars);
- ``agents``: driving the agents through Downloading, Reloading, Enabling;
- ``service``: the ``Transfer`` loop, reconcile and the views;
- ``app``: the HTTP API and the process entry point;
- ``info``: the ``/dict/info`` body and its reader (imported by serving and the local
  pipeline, so this package imports nothing at import time).
"""
