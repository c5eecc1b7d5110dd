"""The serving role (``elastic-ctr serve``): CTR predictions over the Open Inference Protocol
(v2), REST and gRPC, from the served version's dense model and the cube's embeddings, in
worker processes behind one port."""
