"""The MLflow calls and entities the tracker's thread builds on: run tags, dataset inputs, the experiment's id and refused requests.

``runtime.tracking_client`` (``Tracker``) sends its events with them; ``mlflow`` is
imported only inside them, so a process without a tracking URI never imports it.
"""
from __future__ import annotations

from typing import Mapping


def dataset_input(name: str, location: str, digest: str, context: str):
    """An MLflow ``DatasetInput`` of the dataset ``name`` at ``location`` (``mlflow.data``'s
    source for it: a local path, an object-store URI, an HTTP URL)."""
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    with warnings.catch_warnings():  # "can be interpreted in multiple ways": the first is taken
        warnings.simplefilter("ignore")
        source = resolve_dataset_source(location)
    ds = MetaDataset(source=source, name=name, digest=digest)
    return DatasetInput(dataset=ds._to_mlflow_entity(), tags=[InputTag("mlflow.data.context", context)])


def refused(exc: BaseException) -> bool:
    """True when the server answered with an error (``RestException``: a bad request, a
    changed param), as opposed to a server that did not answer (kept and retried)."""
    try:
        from mlflow.exceptions import RestException
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, RestException)


def experiment_id(client, name: str) -> str:
    """The id of experiment ``name``, created when missing; when another tracker (the job's
    and a trainer's run in one process, or two processes) creates it meanwhile, its id."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name)
    except Exception as exc:  # noqa: BLE001 - MlflowException; anything else is raised again
        exp = client.get_experiment_by_name(name) if "RESOURCE_ALREADY_EXISTS" in str(exc) else None
        if exp is None:
            raise
        return exp.experiment_id


def run_tags(d: Mapping[str, str]):
    """``d`` as MLflow ``RunTag`` entities."""
    from mlflow.entities import RunTag

    return [RunTag(k, v) for k, v in d.items()]
