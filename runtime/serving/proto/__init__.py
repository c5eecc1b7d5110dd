"""The Open Inference Protocol's gRPC definition (``open_inference.proto``) and the stubs
setup.py generates from it at build time."""
