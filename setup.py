"""Build hooks; everything else about the package is in pyproject.toml.

- The cube kernel: runtime/cube/kernel.c + kernel_client.c (plain C functions that runtime/cube/kernel.py
  calls through ctypes) compiled into runtime.cube._kernel.
- The pserver's exit on SIGTERM: runtime/trainer/_signals.c into runtime.trainer._signals
  (runtime/trainer/stop.py: exit_on_signal, through ctypes).
- Serving's gRPC stubs: runtime/serving/proto/open_inference.proto compiled by grpcio-tools
  into open_inference_pb2.py and open_inference_pb2_grpc.py beside it (in the source tree,
  so editable installs have them too; they are not committed).
"""
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO = "runtime/serving/proto/open_inference.proto"


class BuildPyWithProtos(build_py):
    """``build_py`` that first generates the gRPC stubs from the .proto."""

    def run(self):
        from grpc_tools import protoc

        rc = protoc.main(["grpc_tools.protoc", f"-I{ROOT}", f"--python_out={ROOT}", f"--grpc_python_out={ROOT}",
                          str(ROOT / PROTO)])
        if rc != 0:
            raise RuntimeError(f"protoc failed on {PROTO} (exit {rc})")
        super().run()


setup(
    ext_modules=[Extension("runtime.cube._kernel", ["runtime/cube/kernel.c", "runtime/cube/kernel_client.c"],
                           depends=["runtime/cube/kernel.h"], extra_compile_args=["-O3"]),
                 Extension("runtime.trainer._signals", ["runtime/trainer/_signals.c"])],
    cmdclass={"build_py": BuildPyWithProtos},
)
