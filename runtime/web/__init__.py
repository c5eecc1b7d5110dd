"""Every role's HTTP stack: ASGI apps on uvicorn (its httptools protocol, uvloop), used
through uvicorn's public API only (``runtime.web.server``), with what that API lacks added
around it: the limits on a request's head (``runtime.web.heads``: an ASGI middleware and
a protocol that holds uvicorn's by composition), and, for the control roles' Flask (WSGI)
apps, probes, whole bodies received before a thread sees them, a work queue limit and a
WSGI bridge (``runtime.web.wsgi``, a2wsgi). ``runtime.web.limits`` defines every limit
once; ``runtime.web.stop`` owns signals, the preStop delay and the grace period of every
role. ``docs/serving-servers.md`` gives the measurements.
"""
