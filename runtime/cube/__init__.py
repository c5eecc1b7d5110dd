"""The cube: the sparse-parameter key-value service, as Paddle Serving's cube, one package per
component: builder (SequenceFiles -> shard dicts), server (one shard of one dict), agent (beside
each server, carries out the transfer's commands), transfer (rolls each version out to every
shard x replica) and client (sharded, replicated lookups); the C kernel, the dict files and the
wire protocol beside them."""
