"""Initializes the native math runtimes that Paddle's CPU wheel ships (Intel MKL and its
OpenMP runtime) on the calling thread, before any parameter-server thread uses them.

Why: a pserver applies updates on a pool of threads (``DAdam::Update`` -> MKL ``vsSqr``).
The first MKL call reads the environment (``mkl_serv_getenv``), and MKL's and OpenMP's
start-up also WRITE it (``libmklml_intel.so`` and ``libiomp5.so`` import ``setenv``;
OpenMP registers itself as ``__KMP_REGISTERED_LIB_<pid>``). glibc's ``getenv`` and
``setenv`` are not safe to run at the same time, and when the first pushes of several
trainers arrive together, pool threads do exactly that: the pserver was seen to die with
SIGSEGV in ``mkl_serv_getenv`` under ``DAdam::Update`` (once, in a local pipeline test
run after every batch became its own push, ``runtime.trainer.psflags``). Making the first MKL and
OpenMP calls on the main thread, before ``fleet.run_server()`` / ``fleet.init_worker()``
start any pool, leaves nothing for the pool threads to write.
"""
from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)


def _lib(name: str):
    import paddle

    path = os.path.join(os.path.dirname(paddle.__file__), "libs", name)
    return ctypes.CDLL(path) if os.path.exists(path) else None


def init_math_runtimes() -> list[str]:
    """Runs one OpenMP query (``omp_get_max_threads``) and one MKL vector op (``vsSqr`` on
    one float32) on this thread. Returns the runtimes initialized (``["openmp", "mkl"]``
    with Paddle 3.0.0's CPU wheel); a wheel without one of them skips it. Call once per
    process, before starting Paddle's parameter-server threads."""
    done = []
    omp = _lib("libiomp5.so")
    if omp is not None:
        omp.omp_get_max_threads()
        done.append("openmp")
    mkl = _lib("libmklml_intel.so")
    if mkl is not None:
        x = (ctypes.c_float * 1)(2.0)
        y = (ctypes.c_float * 1)(0.0)
        mkl.vsSqr(ctypes.c_int(1), x, y)
        if abs(y[0] - 4.0) > 1e-6:
            raise RuntimeError(f"MKL vsSqr(2) returned {y[0]}: the MKL library of this Paddle build misbehaves")
        done.append("mkl")
    log.debug("math runtimes initialized on the main thread: %s", done)
    return done
