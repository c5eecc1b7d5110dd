"""``model_meta.json``: what serving needs to know about a version's dense model. Written by
the trainer's export beside the program and parameters (``versions/<id>/dense/``), read by
serving and the export check. docs/contracts.md, "A version on the file server".

The dense program takes the looked-up embeddings instead of feasign ids: feeds
``feeds[0]`` (the normalized dense features, float32[n,13]) then one float32[n,dim] feed
per slot in slot order (``feeds[1:]``), fetch ``fetches[0]`` (the click probability,
float32[n,1]). ``model_files`` names the program (``inference.pdmodel``, Paddle's legacy
static-graph format: the trainer runs with ``FLAGS_enable_pir_api=0``) and its
parameters (``inference.pdiparams``); readers open exactly those files.

``onnx`` (``OnnxExport``) records the same network in ONNX (``model.onnx``, inputs and
output named as ``feeds`` and ``fetches``) and the export's check of it against Paddle
Inference on sample rows (``max_abs_diff`` of the probabilities, at most
``ONNX_TOLERANCE``); where the conversion failed or disagreed, ``file`` is null and
``error`` says why: the version is served by Paddle Inference. A document without
``onnx`` is a version exported without an ONNX copy (Paddle Inference only).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar, Iterable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from runtime.formats._validation import NonNegInt, PosInt, validated
from runtime.formats.features import DEFAULT_SLOTS, FEASIGN_FUNCTION, NUM_DENSE, SLOT_FEASIGN_FUNCTION

FILE = "model_meta.json"
PROGRAM_SUFFIX, PARAMS_SUFFIX = ".pdmodel", ".pdiparams"
ONNX_SUFFIX = ".onnx"
#: the largest difference of probabilities between ONNX Runtime and Paddle Inference on
#: the export's sample rows for a version to carry its ``model.onnx``
ONNX_TOLERANCE = 1e-5


class ModelMetaError(ValueError):
    """A ``model_meta.json`` is unreadable or invalid; the message names the file and field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FeatureSpec(_Strict):
    """The input rows' features (``feature_spec`` writes it):
    ``format`` criteo|slot, the dense names, the slot ids and names, the feasign function."""

    format: Literal["criteo", "slot"]
    num_dense: PosInt
    dense_names: list[str]
    slots: list[NonNegInt] = Field(min_length=1)
    sparse_names: list[str]
    feasign_function: str
    feasign_doc: str
    missing_feasign: str
    unseen_feasign: str
    module: str


class Normalization(_Strict):
    """The dense transform (``runtime.formats.features.NORMALIZATION``)."""

    type: Literal["log1p_clip_scale"]
    formula: str
    clip_min: float
    clip_max: list[float]
    missing: float


class SparsePart(_Strict):
    """One SequenceFile part of the version's embeddings: file name, rows, bytes."""

    file: str
    count: NonNegInt
    bytes: NonNegInt


class SparseSummary(_Strict):
    """The version's SequenceFiles (``versions/<id>/sparse/``): the whole table (``kind``
    base) or the rows changed since the previous version (``kind`` patch, applied on
    ``base`` and the patches before it)."""

    parts: list[SparsePart]
    count: NonNegInt
    key: str
    value: str
    style: Literal["raw", "bytes_writable", "long_writable"]
    kind: Literal["base", "patch"] = "base"
    base: Optional[int] = None


class OnnxExport(_Strict):
    """The version's ONNX copy of the dense network and the export's check of it.

    ``file``: the ONNX model's name in the dense directory (``model.onnx``), or None when
    there is none (``error`` says why: the conversion failed, or ONNX Runtime disagreed
    with Paddle Inference by more than ``tolerance``). ``opset``: the ONNX opset written.
    ``converter`` / ``runtime``: the converter and the ONNX Runtime of the check, with
    their versions (``paddle2onnx 2.1.0``, ``onnxruntime 1.32.0``). ``check_rows``: the
    sample rows both ran; ``max_abs_diff``: the largest difference of their probabilities
    (None when the check did not run)."""

    file: Optional[str] = None
    opset: Optional[PosInt] = None
    converter: str
    runtime: Optional[str] = None
    check_rows: NonNegInt = 0
    max_abs_diff: Optional[float] = Field(default=None, ge=0)
    tolerance: float = Field(default=ONNX_TOLERANCE, gt=0)
    error: Optional[str] = None

    @model_validator(mode="after")
    def _consistent(self) -> "OnnxExport":
        if self.file is None:
            if not self.error:
                raise ValueError("file: null needs an error saying why there is no ONNX model")
            return self
        if self.error is not None:
            raise ValueError(f"error: set ({self.error!r:.60}) while file names {self.file!r}")
        if "/" in self.file or self.file.startswith(".") or not self.file.endswith(ONNX_SUFFIX):
            raise ValueError(f"file: a plain <name>{ONNX_SUFFIX} expected, got {self.file!r}")
        if self.max_abs_diff is None or self.max_abs_diff > self.tolerance or not self.check_rows:
            raise ValueError(f"file: {self.file!r} without a passed check (check_rows {self.check_rows}, "
                             f"max_abs_diff {self.max_abs_diff}, tolerance {self.tolerance})")
        return self


class ModelMeta(_Strict):
    """The document (module docstring). ``training``: the training settings (free-form
    record); ``metrics``: test AUC and throughput (free-form record)."""

    FILE: ClassVar[str] = FILE

    version: NonNegInt
    created: NonNegInt
    features: FeatureSpec
    embedding_dim: PosInt
    normalization: Normalization
    feeds: list[str] = Field(min_length=2)
    fetches: list[str] = Field(min_length=1, max_length=1)
    model_files: tuple[str, str]
    layers: list[PosInt] = Field(min_length=1)
    sparse: SparseSummary
    training: dict[str, Any]
    metrics: dict[str, Any]
    export_check_max_abs_diff: float = Field(ge=0)
    onnx: Optional[OnnxExport] = None

    @model_validator(mode="after")
    def _consistent(self) -> "ModelMeta":
        if len(self.feeds) != 1 + len(self.features.slots):
            raise ValueError(f"feeds: {len(self.feeds)} names for 1 dense feed + {len(self.features.slots)} slots")
        if len(set(self.feeds)) != len(self.feeds):
            raise ValueError("feeds: a name repeats")
        prog, params = self.model_files
        if not prog.endswith(PROGRAM_SUFFIX) or not params.endswith(PARAMS_SUFFIX):
            raise ValueError(f"model_files: expected [<name>{PROGRAM_SUFFIX}, <name>{PARAMS_SUFFIX}], "
                             f"got {list(self.model_files)}")
        if any("/" in f or f.startswith(".") for f in self.model_files):
            raise ValueError(f"model_files: plain file names expected, got {list(self.model_files)}")
        if len(self.normalization.clip_max) != self.features.num_dense:
            raise ValueError(f"normalization.clip_max: {len(self.normalization.clip_max)} bounds for "
                             f"{self.features.num_dense} dense features")
        return self

    @property
    def dense_feed(self) -> str:
        """Feed name of the normalized dense features."""
        return self.feeds[0]

    @property
    def emb_feeds(self) -> list[str]:
        """Feed names of the slots' embeddings, in slot order."""
        return list(self.feeds[1:])

    @property
    def fetch(self) -> str:
        """Fetch name of the click probability."""
        return self.fetches[0]

    @property
    def num_slots(self) -> int:
        return len(self.features.slots)

    def files_in(self, model_dir: str | os.PathLike) -> tuple[Path, Path]:
        """``(program path, params path)`` under ``model_dir``; raises ``ModelMetaError`` if
        either is missing."""
        d = Path(model_dir)
        paths = (d / self.model_files[0], d / self.model_files[1])
        for p in paths:
            if not p.is_file():
                raise ModelMetaError(f"{d / FILE}: model_files names {p.name}, which is not in {d}")
        return paths

    @property
    def onnx_file(self) -> Optional[str]:
        """The ONNX model's file name (``model.onnx``), or None when the version has none."""
        return self.onnx.file if self.onnx is not None else None

    @property
    def files(self) -> tuple[str, ...]:
        """Every model file the directory holds besides ``model_meta.json``: the program,
        its parameters and, when there is one, the ONNX model."""
        return self.model_files + ((self.onnx_file,) if self.onnx_file else ())

    def onnx_in(self, model_dir: str | os.PathLike) -> Path:
        """The ONNX model's path under ``model_dir``. Raises ``ModelMetaError`` when the
        version has none (naming why) or the file is missing."""
        d = Path(model_dir)
        if not self.onnx_file:
            why = self.onnx.error if self.onnx is not None else "exported without an ONNX model"
            raise ModelMetaError(f"{d / FILE}: no ONNX model ({why})")
        p = d / self.onnx_file
        if not p.is_file():
            raise ModelMetaError(f"{d / FILE}: onnx.file names {p.name}, which is not in {d}")
        return p

    def write(self, model_dir: str | os.PathLike) -> Path:
        """Writes ``<model_dir>/model_meta.json``; returns its path."""
        path = Path(model_dir) / FILE
        path.write_text(json.dumps(self.model_dump(mode="json"), indent=2) + "\n")
        return path

    @classmethod
    def parse(cls, doc: object, source: str = FILE) -> "ModelMeta":
        """Validates a parsed document; raises ``ModelMetaError`` naming ``source``."""
        return validated(cls, doc, ModelMetaError, f"{source}: invalid model metadata")

    @classmethod
    def read(cls, model_dir: str | os.PathLike) -> "ModelMeta":
        """Reads ``<model_dir>/model_meta.json`` (a local directory). Raises ``ModelMetaError``."""
        path = Path(model_dir) / FILE
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ModelMetaError(f"{path}: cannot read model metadata: {exc}") from None
        return cls.parse(doc, str(path))


def feature_spec(fmt: str = "criteo", slots: Iterable[int] = DEFAULT_SLOTS) -> dict:
    """The feature description written to ``model_meta.json`` (``features``, a
    ``FeatureSpec``) for rows of format ``fmt`` with ``slots`` (``runtime.formats.features``)."""
    slots = [int(s) for s in slots]
    return {
        "format": fmt,
        "num_dense": NUM_DENSE,
        "dense_names": [f"I{i}" for i in range(1, NUM_DENSE + 1)],
        "slots": slots,
        "sparse_names": [f"C{i}" for i in range(1, len(slots) + 1)] if fmt == "criteo" else [str(s) for s in slots],
        "feasign_function": FEASIGN_FUNCTION if fmt == "criteo" else SLOT_FEASIGN_FUNCTION,
        "feasign_doc": "criteo: (slot << 33) | int(hex, 16) for 1..8 hex digits; missing: (slot << 33) | (1 << 32); "
                       "slot format: feasign as given, missing slot as above",
        "missing_feasign": "(slot << 33) | (1 << 32)",
        "unseen_feasign": "zero embedding",
        "module": "runtime.formats.features",
    }
