"""Subcommands of the serving role: ``serve`` and the demo ``client``.

Heavy imports (Paddle, ONNX Runtime, numpy) happen inside the handlers so ``--help`` is fast.
"""
from __future__ import annotations

import argparse
import math

import os

from runtime import bound_ports, dense_backends, role_specs
from runtime.cli import HelpFormatter, runs_main


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0 (else a usage error naming the value)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative (0 or more)")
    return value


def _non_negative(unit: str):
    """argparse type: a finite number of ``unit`` >= 0 (else a usage error naming the value)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit}") from None
        if not math.isfinite(value) or value < 0:
            raise argparse.ArgumentTypeError(f"{text} is not a finite number of {unit} >= 0")
        return value

    return parse


_non_negative_seconds = _non_negative("seconds")


def _positive(unit: str):
    """argparse type: a finite number of ``unit`` > 0 (else a usage error naming the value)."""
    non_negative = _non_negative(unit)

    def parse(text: str) -> float:
        value = non_negative(text)
        if value == 0:
            raise argparse.ArgumentTypeError(f"0 {unit}: more is needed")
        return value

    return parse


_positive_seconds = _positive("seconds")


def register(sub: "argparse._SubParsersAction") -> None:
    """Adds ``serve`` and ``client`` to the top-level parser."""
    # -- serve --------------------------------------------------------------------------
    p = sub.add_parser(
        "serve", formatter_class=HelpFormatter,
        help="CTR prediction server (Open Inference Protocol v2 + /predict) over cube and the dense model",
        description="Serving: loads the dense model of the version cube serves, looks embeddings "
        "up in cube, answers the Open Inference Protocol v2 (KServe/Triton) on /v2/... and raw "
        "lines on POST /predict; Prometheus metrics on /metrics. HTTP: uvicorn in each worker "
        "process (docs/serving-servers.md).",
    )
    p.add_argument("--topology", required=True, help="cube topology JSON file (docs/contracts.md)")
    p.add_argument("--model-root", required=True,
                   help="version root ROOT (directory or file-server URL): ROOT/versions/<id>/dense")
    p.add_argument("--transfer-url", default=None,
                   help="cube transfer URL; its /dict/info 'version' is the version served "
                   "(default: follow ROOT/donefile instead)")
    p.add_argument("--host", default="0.0.0.0", help="listen address")
    p.add_argument("--port", type=int, default=role_specs.PORTS["serving"]["http"],
                   help="HTTP port (REST: v2 protocol, /predict, /metrics; 0: any free port, see --port-file)")
    p.add_argument("--grpc-port", type=int, default=role_specs.PORTS["serving"]["grpc"],
                   help="gRPC port (inference.GRPCInferenceService), served by every worker (0: any free port)")
    p.add_argument("--no-grpc", action="store_true", help="serve no gRPC")
    bound_ports.add_flag(p)
    p.add_argument("--grpc-max-connection-age-seconds", type=_non_negative_seconds, default=30.0, metavar="SECONDS",
                   help="a gRPC connection older than this is asked to reconnect (GOAWAY; calls in flight "
                   "finish; the client's channel reconnects by itself), so long-lived channels spread over "
                   "the workers and over replicas added later (default 30; 0 = never)")
    p.add_argument("--workers", type=int, default=_env_int("SERVING_WORKERS", 2),
                   help="worker processes serving HTTP (uvicorn) and gRPC (or $SERVING_WORKERS), each on its "
                   "own SO_REUSEPORT socket; each loads the dense model and its own cube clients (a request's "
                   "Python work holds the GIL, so processes, not threads, use several cores)")
    p.add_argument("--threads", type=int, default=1,
                   help="inference threads per worker (default 1: the dense model releases the GIL while it "
                   "runs, but decoding, the cube lookups and encoding hold it, so under concurrent requests a "
                   "second thread mostly waits for it; README, Benchmarks, Serving); "
                   "with more, concurrent requests in a worker are combined into one cube lookup and predictor run")
    p.add_argument("--max-batch", type=int, default=4096,
                   help="largest batch accepted, in samples (larger: 400 / INVALID_ARGUMENT)")
    p.add_argument("--max-body-bytes", type=int, default=64 << 20,
                   help="largest request accepted, in bytes: an HTTP body (larger: 413) or a gRPC message "
                   "(larger: RESOURCE_EXHAUSTED)")
    p.add_argument("--max-queue", type=_non_negative_int, default=8,
                   help="per worker: inference requests that may wait for a worker thread (REST; gRPC likewise, "
                   "beyond --threads running); one more is answered at once 503 with Retry-After: 1 (gRPC "
                   "RESOURCE_EXHAUSTED), so a request waits at most about (threads + max-queue) request times "
                   "(8: near 0.1 s at batch 256 on 2 idle cores); health and metadata are answered by the event loop "
                   "and keep answering")
    p.add_argument("--inline-max-bytes", type=_non_negative_int, default=8192, metavar="BYTES",
                   help="an inference request with a body of at most this many bytes, coming when no other "
                   "inference of the worker runs or waits, runs on the worker's event loop instead of a thread "
                   "(saves the hand-off, about 60 us of CPU per request); a small request taking over 20 ms sends "
                   "inference to the threads for 10 s, so a slow cube replica holds the loop once "
                   "(docs/serving-servers.md); 0: every inference on the threads")
    p.add_argument("--header-timeout-seconds", type=_positive_seconds, default=10.0, metavar="SECONDS",
                   help="seconds a client may take to send a request's headers, from their first byte, before "
                   "its connection is closed (uvicorn has no such timeout: serving adds it to uvicorn's "
                   "httptools protocol, runtime/serving/worker.py)")
    p.add_argument("--idle-timeout-seconds", type=_positive_seconds, default=30.0, metavar="SECONDS",
                   help="seconds a connection may stay without sending anything before it is closed: between "
                   "requests (uvicorn's timeout_keep_alive), a new connection, a stalled body (408)")
    p.add_argument("--grace-period-seconds", type=_positive_seconds, default=20.0, metavar="SECONDS",
                   help="on SIGTERM, seconds the requests and gRPC calls in flight get to finish before "
                   "a worker is killed (keep it below the pod's terminationGracePeriodSeconds)")
    p.add_argument("--poll-seconds", type=float, default=0.5,
                   help="seconds between checks for a new version")
    p.add_argument("--cube-timeout-ms", type=float, default=200.0,
                   help="cube lookup timeout per try, ms")
    p.add_argument("--work-dir", default=None,
                   help="where downloaded dense models are kept (default: a temporary directory)")
    p.add_argument("--dense-backend", choices=dense_backends.BACKENDS, default=dense_backends.DEFAULT,
                   help="what runs the dense network: ONNX Runtime on the version's model.onnx (a version without one "
                   "runs on Paddle Inference, which must then be installed: the serving-paddle image), or Paddle "
                   "Inference on its program and parameters (docs/serving.md)")
    p.add_argument("--format", choices=("criteo", "slot"), default="criteo",
                   help="raw-line format accepted by /predict and BYTES inputs")
    p.add_argument("--slot-file", default=None, help="slot list for --format slot")
    p.set_defaults(handler=_serve)

    # -- client -------------------------------------------------------------------------
    p = sub.add_parser(
        "client", formatter_class=HelpFormatter,
        help="demo client: sends test data to serving over the v2 API, reports AUC, QPS, latency",
        description="Demo client: sends test data to serving over the Open Inference Protocol v2 (REST), by "
        "--concurrency processes, and reports the AUC of the answers, requests per second and latency percentiles.",
    )
    p.add_argument("--url", required=True, help="serving base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--data", nargs="+", required=True, help="test data: files, globs or URLs")
    p.add_argument("--format", choices=("criteo", "slot", "auto"), default="auto",
                   help="data format (default: auto-detect)")
    p.add_argument("--slot-file", default=None, help="slot list for --format slot")
    p.add_argument("--concurrency", type=int, default=4,
                   help="concurrent workers, one process and keep-alive connection each")
    p.add_argument("--batch-size", type=int, default=1, help="samples per request")
    p.add_argument("--max-requests", type=int, default=None,
                   help="stop after this many requests (default: one pass over the data)")
    p.add_argument("--duration", type=float, default=None,
                   help="keep cycling over the data for this many seconds")
    p.add_argument("--until-file", default=None,
                   help="keep cycling over the data until this file exists")
    p.add_argument("--rate", type=float, default=0.0,
                   help="requests/s over all workers (0: as fast as serving answers)")
    p.add_argument("--mode", choices=("features", "lines"), default="features",
                   help="send parsed features (FP32+UINT64 tensors) or raw lines (BYTES)")
    p.add_argument("--timeout", type=float, default=10.0, help="request timeout, s")
    p.add_argument("--json-out", default=None, help="also write the report as JSON here")
    p.add_argument("--predictions-out", default=None,
                   help="write 'row<TAB>label<TAB>probability<TAB>version' per scored row here")
    runs_main(p, "runtime.serving.client")


def check_serve_inputs(args) -> None:
    """What ``serve`` can tell is wrong before it starts a worker or says it serves: the
    topology file (it must load: ``runtime.formats.topology``), the model root's form (a
    local directory that exists, a URL with a host, or a store location whose package is
    installed; nothing is fetched: a file server or bucket that is not up yet is waited
    for, serving answers 503 until a version loads), the transfer URL's form and the
    worker count. Raises ``errors.InputError`` or ``storage.LocationError`` naming the flag."""
    from urllib.parse import urlparse

    from runtime import objectstore, storage
    from runtime.errors import InputError
    from runtime.formats.topology import Topology, TopologyError

    try:
        Topology.load(args.topology)
    except TopologyError as exc:
        raise InputError(f"--topology {exc}") from None
    root = str(args.model_root)
    if storage.is_url(root):
        if not urlparse(root).hostname:
            raise InputError(f"--model-root {root}: a URL without a host")
    elif storage.is_store(root):
        try:
            objectstore.filesystem(root)
        except objectstore.StoreError as exc:
            raise InputError(f"--model-root {root}: {exc}") from None
    elif not os.path.isdir(root):
        raise storage.LocationNotFound(f"--model-root {root}: no such directory")
    if args.transfer_url is not None:
        url = urlparse(str(args.transfer_url))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise InputError(f"--transfer-url {args.transfer_url}: expected http(s)://HOST:PORT")
    if args.workers < 1:
        raise InputError(f"--workers {args.workers}: at least 1 is needed")


def _serve(args) -> int:
    from runtime.serving import launcher

    check_serve_inputs(args)
    return launcher.main(args)
