"""The contracts two or more parts of the pipeline share, one owner module each.

Writers and readers both go through these modules, so a reader accepts exactly what the
writer writes (docs/contracts.md describes each one):

- ``features``: the input rows (Criteo TSV/CSV, ElasticCTR's slot format), the feasign
  function (the cube key) and the dense normalization.
- ``donefile``: donefile lines and the version layout under a root.
- ``model_meta``: ``model_meta.json``, the description of a version's dense model.
- ``topology``: the cube topology (shards x replicas) read by the transfer, serving and the
  cube client.
- ``seqfile``: the Hadoop SequenceFile holding a version's embeddings.
- ``partitions``: the hourly training-data partitions (``ROOT/YYYYMMDD/HH/``, ``_SUCCESS``)
  landed by ``data generate --hours`` or an upstream job and read by the trainer.
- ``train_result``: the trainer's result lines (``ELASTIC_CTR_RESULT``,
  ``ELASTIC_CTR_SUMMARY``) read by the local-cluster launcher, the local pipeline and tests.

``_validation`` is private: it turns the models' validation errors into one message.

The cube's data-plane wire protocol (``runtime.cube.protocol``) and dict files
(``runtime.cube.dictfile``) are private to the cube and live there.
"""
