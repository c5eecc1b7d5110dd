"""The KServe peer of ``elastic-ctr serve`` for ``make bench-serving-peers``: a KServe
``ModelServer`` (uvicorn, ``--workers`` processes, REST only) serving the model ``ctr``,
whose ``Model.predict`` answers with this project's own data plane
(``runtime.serving.launcher.build_dataplane``: the same version watcher, cube client, CTR
model, checks and dense backend as serving, ``--dense-backend``), so the two servers differ
only in what lies above the data plane (HTTP server, JSON codec, request and response
objects).

Runs in its own venv (``.venv-kserve``, requirements/kserve.txt: KServe 0.21 needs protobuf
6, the project's venv pins < 6) with the project importable through ``PYTHONPATH`` (the
benchmark sets it to the repository it measures).

KServe's ``ModelServer`` with more than one worker starts them with multiprocessing's
``spawn`` and pickles the registered models into them (``kserve/protocol/rest/multiprocess``):
the model pickles without its data plane and each worker builds its own once unpickled,
on a thread (as each ``elastic-ctr serve`` worker builds its own), then writes
``<work-dir>/ready-<pid>`` (``<version> <dense backend>``: what that worker runs) so the
benchmark knows every worker holds a loaded version, and on which backend.
Each worker also keeps the thread CPU of its ``DataPlane.infer`` calls in
``<work-dir>/plane-<pid>`` (``bench/plane_cpu.py``): the benchmark's measure of what the
shared part of a request costs.

Per-request logs are off as in serving: uvicorn's access log at WARNING, KServe's latency
logging off. Errors keep their status: the data plane's ``BadRequest`` is KServe's ``InvalidInput``
(400), ``NotFound`` its ``ModelNotFound`` (404), anything else unavailable its
``ModelNotReady`` (503). SIGTERM: KServe's own handling (the parent stops its workers).
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import logging
import os
import sys
import threading
import uuid
from pathlib import Path

from plane_cpu import PlaneClock  # bench/, this script's directory

from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
from kserve.errors import InvalidInput, ModelNotFound, ModelNotReady

MODEL_NAME = "ctr"
log = logging.getLogger("kserve_peer")


def quiet_access_log() -> None:
    """KServe's logging configuration with uvicorn's access log at WARNING: no line per
    request, as ``elastic-ctr serve`` (uvicorn's ``access_log`` off). KServe's
    ``configure_logging(None)`` leaves a configured ``kserve`` logger as it is."""
    import copy
    import logging.config

    from kserve.logging import KSERVE_LOG_CONFIG

    cfg = copy.deepcopy(KSERVE_LOG_CONFIG)
    cfg["loggers"]["uvicorn.access"]["level"] = "WARNING"
    logging.config.dictConfig(cfg)


def patient_pings(timeout_s: float = 60.0) -> None:
    """KServe's parent pings each worker every 0.5 s and kills one that does not answer
    within 5 s (``RESTServerProcess.is_alive``); a spawned worker answers only once it has
    imported KServe and this module, which alone took longer than 5 s on this shared machine
    at load 20 (workers were killed and restarted in a loop). The parent here waits
    ``timeout_s`` instead: only start-up tolerance changes, not how requests are served."""
    from kserve.protocol.rest.multiprocess import server as mp_server

    is_alive = mp_server.RESTServerProcess.is_alive

    def patient(self, timeout: float = timeout_s) -> bool:
        return is_alive(self, max(timeout, timeout_s))

    mp_server.RESTServerProcess.is_alive = patient


class CtrPeer(Model):
    """The model ``ctr`` over this project's data plane (module docstring).

    Args:
        plane_args: ``build_dataplane``'s keyword arguments (topology, model_root,
            transfer_url, work_dir, threads, ...); ``work_dir`` gets a ``w<pid>`` directory
            per worker.
        ready_dir: where each worker writes ``ready-<pid>`` once its data plane has a version.
    """

    def __init__(self, plane_args: dict, ready_dir: str):
        super().__init__(MODEL_NAME)
        self.plane_args = dict(plane_args)
        self.ready_dir = ready_dir
        self.plane = None
        self.clock = None  # the data plane's CPU (plane_cpu.PlaneClock), per worker
        self.ready = True  # the parent serves nothing: its workers load (__setstate__)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["plane"] = None  # threads, sockets and Paddle predictors stay in the process that made them
        state["clock"] = None
        return state

    def __setstate__(self, state):
        """A spawned worker: its data plane is built on a thread, since KServe's parent
        kills a worker that does not answer its ping within 5 s, and the worker starts
        answering only once unpickled (Paddle's import alone can take longer on a loaded
        machine). Not ready (503) until then."""
        self.__dict__.update(state)
        quiet_access_log()  # before the worker's own configure_logging, which then keeps it
        self.ready = False
        threading.Thread(target=self.load_plane, name="load-plane", daemon=True).start()

    def load_plane(self) -> None:
        """Builds this process's data plane, waits for its first version (up to 120 s) and
        marks the model ready; logs the error and stays not ready when none is loaded."""
        from runtime.serving.launcher import build_dataplane

        try:
            args = dict(self.plane_args)
            args["work_dir"] = os.path.join(args["work_dir"], f"w{os.getpid()}")
            self.clock = PlaneClock(self.ready_dir)  # before the plane: a request may come once it is set
            self.plane = build_dataplane(**args, wait_s=120.0)
            ok, why = self.plane.ready()
            if not ok:
                raise RuntimeError(f"data plane not ready: {why}")
            self.ready = True
            model = self.plane.default.watcher.current
            Path(self.ready_dir, f"ready-{os.getpid()}").write_text(f"{model.version} {model.backend}")
        except Exception:
            log.exception("KServe peer worker %d: no data plane", os.getpid())

    def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        """KServe's v2 request -> the project's ``InferRequest`` (inputs' data as KServe
        decoded it) -> ``DataPlane.infer`` -> KServe's ``InferResponse``. Runs on the
        worker's event loop (KServe's way for a synchronous ``predict``)."""
        return self.answer(payload)

    def answer(self, payload: InferRequest) -> InferResponse:
        """``predict``'s work (its docstring)."""
        from runtime.serving import protocol

        if self.plane is None:
            raise ModelNotReady(self.name, "its data plane is still loading")
        inputs = [protocol.InferInput(i.name, i.datatype, list(i.shape), data=i.data,
                                      parameters=dict(i.parameters or {}), where=f"inputs[{k}]")
                  for k, i in enumerate(payload.inputs)]
        outputs = None
        if payload.request_outputs:
            outputs = [protocol.RequestedOutput(o.name, dict(o.parameters or {})) for o in payload.request_outputs]
        req = protocol.InferRequest(inputs=inputs, id=payload.id, outputs=outputs,
                                    parameters=dict(payload.parameters or {}))
        t0 = self.clock.start()
        try:
            resp = self.plane.infer(self.name, None, req)
        except protocol.BadRequest as exc:
            raise InvalidInput(str(exc)) from None
        except protocol.NotFound as exc:
            raise ModelNotFound(str(exc)) from None
        except protocol.InferenceError as exc:
            raise ModelNotReady(self.name, str(exc)) from None
        finally:
            self.clock.stop(t0)
        outs = [InferOutput(o.name, list(o.shape), o.datatype, data=o.data) for o in resp.outputs]
        return InferResponse(response_id=payload.id or str(uuid.uuid4()), model_name=self.name, infer_outputs=outs,
                             model_version=resp.model_version)


class ThreadedCtrPeer(CtrPeer):
    """``CtrPeer`` whose ``predict`` is a coroutine running the work on a pool of
    ``threads`` threads per worker (``loop.run_in_executor``), so that a worker's concurrent
    requests overlap their cube round trips as a threaded ``elastic-ctr serve`` worker's do
    (``--threads``), instead of one at a time on the event loop."""

    def __init__(self, plane_args: dict, ready_dir: str, threads: int):
        super().__init__(plane_args, ready_dir)
        self.threads = int(threads)
        self.pool = None

    def __getstate__(self):
        state = super().__getstate__()
        state["pool"] = None
        return state

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        if self.pool is None:
            self.pool = concurrent.futures.ThreadPoolExecutor(self.threads, thread_name_prefix="predict")
        return await asyncio.get_running_loop().run_in_executor(self.pool, self.answer, payload)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topology", required=True, help="the cube topology file (serve --topology)")
    ap.add_argument("--model-root", required=True, help="the versions' root (serve --model-root)")
    ap.add_argument("--transfer-url", default=None, help="the cube transfer's URL (serve --transfer-url)")
    ap.add_argument("--work-dir", required=True, help="scratch directory (downloaded models, ready markers)")
    ap.add_argument("--port", type=int, required=True, help="HTTP port")
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes (default 2)")
    ap.add_argument("--threads", type=int, default=2, help="predictors per worker (serve --threads; default 2)")
    ap.add_argument("--cube-timeout-ms", type=float, default=200.0,
                    help="cube lookup timeout (serve --cube-timeout-ms; default 200)")
    ap.add_argument("--dense-backend", choices=["onnxruntime", "paddle"], default="onnxruntime",
                    help="what runs the dense network (serve --dense-backend; default onnxruntime)")
    # (KServe parses this process's argv too, at import, with prefix matching: no option
    # here may be a prefix of one of KServe's, e.g. --predict of --predictor_host)
    ap.add_argument("--predict-on", choices=["sync", "threads"], default="sync",
                    help="sync: predict on the event loop (KServe's way for a synchronous model; default); "
                         "threads: on --threads threads per worker (ThreadedCtrPeer)")
    args = ap.parse_args()
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    quiet_access_log()
    plane_args = {"topology": args.topology, "model_root": args.model_root, "transfer_url": args.transfer_url,
                  "work_dir": args.work_dir, "threads": args.threads, "cube_timeout_ms": args.cube_timeout_ms,
                  "dense_backend": args.dense_backend}
    if args.predict_on == "threads":
        model = ThreadedCtrPeer(plane_args, args.work_dir, args.threads)
    else:
        model = CtrPeer(plane_args, args.work_dir)
    if args.workers <= 1:
        model.load_plane()
        if model.plane is None:
            return 1
    patient_pings()
    ModelServer(http_port=args.port, workers=args.workers, enable_grpc=False,
                enable_latency_logging=False).start([model])
    return 0


if __name__ == "__main__":
    sys.exit(main())
