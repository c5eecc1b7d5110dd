"""The command line's error contract: which failures are the user's to fix (bad input or
an environment that is not ready), how each is worded, and the exit codes.

``runtime.cli.main`` runs every subcommand's handler; an exception that ``is_input_error``
recognises becomes ONE line on stderr, ``elastic-ctr <command>: error: <message>``, and
exit code ``BAD_INPUT`` (2, argparse's own code for a usage error), never a traceback. The
message of each of these exceptions names the flag or location and what is wrong (the
project's rule for bad input). Any other exception is a defect or a failure while running:
its traceback is kept.

Exit codes of every subcommand (a command may give ``FAILED`` a documented meaning of its
own, e.g. ``schema check``: a partition breaks the schema):

=====  ======================================================================
code   meaning
=====  ======================================================================
0      done (a long-running role: stopped by SIGTERM after its in-flight work)
1      ``FAILED``: the work failed or the check found a problem
2      ``BAD_INPUT``: a flag, file, location, credential or stack setting is
       wrong, missing or unreachable; nothing was changed
3      serving only: a worker died before it served (``runtime.serving.launcher``)
130    interrupted (Ctrl-C)
=====  ======================================================================
"""
from __future__ import annotations

import socket
from typing import Optional

FAILED = 1
BAD_INPUT = 2

#: the project's exceptions that mean bad input or an environment that is not ready, by
#: qualified name (checked along the exception's MRO, so the check imports nothing)
INPUT_ERRORS = frozenset({
    "runtime.errors.InputError",
    "runtime.storage.LocationError",            # a path, URL or bucket missing, unreadable, unreachable
    "runtime.objectstore.StoreError",           # a store's package missing, a store that cannot be opened
    "runtime.auth.CredentialError",             # a credential a role needs is not configured
    "runtime.formats.partitions.PartitionError",  # --start-hour / --end-hour and partition names
    "runtime.formats.data_schema.SchemaError",  # a data schema file that does not parse or fit
    "runtime.formats.topology.TopologyError",   # a cube topology file
    "runtime.trainer.config.TrainConfigError",  # train's flags, checked together
    "runtime.trainer.roles.RoleError",          # the parameter-server environment contract
    "runtime.cube.transfer.rollback.RollbackError",
    "runtime.local.prometheus_server.PrometheusError",  # --prometheus without Prometheus installed
    "runtime.local.mlflow_server.MlflowServerError",
    "infra.config.ConfigError",                 # a stack setting
    "infra.render.RenderError",
})


class InputError(ValueError):
    """Bad input the user must fix (a flag's value, a file's content); the message names
    the flag or file and what is wrong. The command exits ``BAD_INPUT``."""


def is_input_error(exc: BaseException) -> bool:
    """True if ``exc`` is one of ``INPUT_ERRORS`` (or a subclass of one)."""
    return any(f"{c.__module__}.{c.__qualname__}" in INPUT_ERRORS for c in type(exc).__mro__)


def one_line(exc: BaseException) -> str:
    """``exc``'s message on one line (whitespace runs collapsed; the type's name when the
    message is empty)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def connection_reason(exc: BaseException) -> str:
    """Why an HTTP request (``requests``/``urllib3``) got no answer, in a few words:
    ``connection refused``, ``host not found``, ``timed out``, ``TLS: <why>``, else the
    innermost error's first line. Follows ``__cause__``/``__context__`` and urllib3's
    ``reason`` attributes down to the socket error."""
    chain = []
    todo: list[BaseException] = [exc]
    while todo and len(chain) < 16:
        e = todo.pop()
        if any(e is c for c in chain):
            continue
        chain.append(e)
        for nxt in (getattr(e, "reason", None), e.__cause__, e.__context__, *getattr(e, "args", ())[:1]):
            if isinstance(nxt, BaseException):
                todo.append(nxt)
    for e in chain:
        if isinstance(e, ConnectionRefusedError):
            return "connection refused"
        if isinstance(e, socket.gaierror):
            return "host not found"
    for e in chain:
        name = type(e).__name__
        if isinstance(e, TimeoutError) or "Timeout" in name:
            return "timed out"
        if "SSL" in name:
            return f"TLS: {one_line(e)}"
    return one_line(chain[-1])
