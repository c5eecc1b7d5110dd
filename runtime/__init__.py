"""The pipeline's runtime: every role's code (trainer, cube, serving, file server, tracking),
the contracts they share (``formats``), their Prometheus definitions (``metrics``), their
HTTP stack (``web``), the local harnesses (``local``) and the ``elastic-ctr`` command line
(``cli``)."""
