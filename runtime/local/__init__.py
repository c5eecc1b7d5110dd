"""Every local harness: the roles as processes on 127.0.0.1, started with the same
subcommands the pods run. The local pipeline (``elastic-ctr local``, what ``make demo``
runs: ``pipeline``, ``online``, ``services``), the local cube cluster (``cube``), the local
parameter-server cluster (``ps``, ``elastic-ctr train --local-cluster``), and the local
Prometheus (``prometheus_server``, fed by the launchers' scrape ``targets``, drawn by
``chart``), beside the local MLflow server (``mlflow_server``)."""
