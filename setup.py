"""Build hook: compiles the cube kernel (runtime/cube/kernel.c: plain C functions that
runtime/cube/kernel.py calls through ctypes) into runtime.cube._kernel. Everything else
about the package is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("runtime.cube._kernel", ["runtime/cube/kernel.c"], extra_compile_args=["-O3"])])
