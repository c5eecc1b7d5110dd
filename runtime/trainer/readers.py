"""Streaming readers: locations (paths, globs, HTTP(S) URLs) -> batches of numpy arrays.

Lines are streamed through ``runtime.storage.iter_lines`` (a URL is never loaded whole;
``.gz`` is decompressed), parsed in chunks by the vectorized parsers of
``runtime.formats.features``, and cut into batches. Malformed lines are counted and
skipped with a warning naming the file and line number, within an error budget
(``BadLineBudget``); past it ``TooManyBadLines`` is raised.

Sharding among trainers is by line: trainer ``i`` of ``n`` keeps the data lines whose
running index (over all files, in order) is ``i`` modulo ``n``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from runtime import storage
from runtime.formats import features

log = logging.getLogger(__name__)

MAX_WARNINGS = 20  # individual bad-line warnings per reader; later ones are only counted


class TooManyBadLines(RuntimeError):
    """More malformed lines than the error budget allows; the message names the last one."""


class BadLineBudget:
    """Counts malformed lines against a budget.

    ``max_bad_lines``: absolute budget (None = no absolute limit); ``max_bad_fraction``:
    budget as a fraction of lines seen (checked once at least 1000 lines were read, and
    at ``finish()``). Both None = unlimited.
    """

    def __init__(self, max_bad_lines: int | None = 100, max_bad_fraction: float | None = None):
        self.max_bad_lines = max_bad_lines
        self.max_bad_fraction = max_bad_fraction
        self.bad = 0
        self.seen = 0

    def record(self, location: str, lineno: int, reason: str) -> None:
        """Counts one bad line (``lineno`` 1-based) and warns; raises ``TooManyBadLines``."""
        self.bad += 1
        if self.bad <= MAX_WARNINGS:
            log.warning("%s line %d: malformed, skipped: %s", location, lineno, reason)
        elif self.bad == MAX_WARNINGS + 1:
            log.warning("more malformed lines: further warnings suppressed (counted)")
        if self.max_bad_lines is not None and self.bad > self.max_bad_lines:
            raise TooManyBadLines(
                f"{self.bad} malformed lines exceed the budget --max-bad-lines {self.max_bad_lines} "
                f"(last: {location} line {lineno}: {reason})")
        self._check_fraction(location, lineno, reason, final=False)

    def _check_fraction(self, location: str, lineno: int, reason: str, final: bool) -> None:
        f = self.max_bad_fraction
        if f is None or self.seen == 0 or (not final and self.seen < 1000):
            return
        if self.bad / self.seen > f:
            raise TooManyBadLines(
                f"{self.bad} of {self.seen} lines malformed ({self.bad / self.seen:.2%}) exceed the budget "
                f"--max-bad-fraction {f} (last: {location} line {lineno}: {reason})")

    def finish(self) -> None:
        """Final check of the fractional budget (call at the end of a pass)."""
        self._check_fraction("(all inputs)", 0, "end of input", final=True)


@dataclass
class Batch:
    """``labels`` int64[n], ``dense`` float32[n,13] normalized, ``feasigns`` uint64[n,S]."""

    labels: np.ndarray
    dense: np.ndarray
    feasigns: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def resolve(locations: Sequence[str]) -> list[str]:
    """Expands paths/globs/directories to files and checks every one is readable.

    Raises ``storage.LocationError`` naming the first location that is missing, matches
    nothing, or is unreachable (URLs: HTTP HEAD). A store location, prefix or glob
    (``s3://...``) expands to its objects. Returns the file list in order.
    """
    files: list[str] = []
    for loc in locations:
        if storage.is_url(loc):
            storage.check_readable(loc)
            files.append(loc)
            continue
        matched = storage.expand(loc)
        if not matched:
            raise storage.LocationError(f"{loc}: no such file (or the glob matches no file)")
        files.extend(matched)
    if not files:
        raise storage.LocationError("no input locations given")
    return files


def iter_batches(
    files: Sequence[str],
    fmt: str = "criteo",
    batch_size: int = 512,
    slots: Sequence[int] = features.DEFAULT_SLOTS,
    shard: tuple[int, int] = (0, 1),
    budget: BadLineBudget | None = None,
    chunk_lines: int = 8192,
    normalize: bool = True,
) -> Iterator[Batch]:
    """Yields ``Batch``es of ``batch_size`` rows (the last may be smaller) from ``files``.

    ``shard = (index, count)`` keeps data lines ``index`` mod ``count``. Dense features
    are normalized (``features.normalize_dense``) unless ``normalize`` is False.
    Raises ``TooManyBadLines`` past the budget, ``storage.LocationError`` for unreadable
    input.
    """
    if batch_size <= 0:
        raise ValueError(f"batch size must be > 0, got {batch_size}")
    idx, count = shard
    if not (count >= 1 and 0 <= idx < count):
        raise ValueError(f"bad shard {shard}: need 0 <= index < count")
    budget = budget if budget is not None else BadLineBudget()
    if fmt not in features.FORMATS:
        raise ValueError(f"unknown data format {fmt!r} (expected one of {', '.join(features.FORMATS)})")
    pend: list[Batch] = []
    pend_n = 0
    running = 0  # data-line counter over all files, for sharding

    def flush(final: bool) -> Iterator[Batch]:
        nonlocal pend, pend_n
        if not pend:
            return
        lab = np.concatenate([b.labels for b in pend])
        den = np.concatenate([b.dense for b in pend])
        fs = np.concatenate([b.feasigns for b in pend])
        start = 0
        while len(lab) - start >= batch_size:
            yield Batch(lab[start:start + batch_size], den[start:start + batch_size], fs[start:start + batch_size])
            start += batch_size
        rest = Batch(lab[start:], den[start:], fs[start:])
        pend, pend_n = ([rest], len(rest)) if len(rest) else ([], 0)
        if final and pend_n:
            yield rest
            pend, pend_n = [], 0

    for loc in files:
        chunk: list[str] = []
        linenos: list[int] = []
        lineno = 0

        def take(chunk: list[str], linenos: list[int]) -> Batch:
            parsed = features.parse_lines(chunk, fmt, slots)
            for j, reason in parsed.bad:
                budget.record(loc, linenos[j], reason)
            dense = features.normalize_dense(parsed.dense) if normalize else parsed.dense
            return Batch(parsed.labels, dense, parsed.feasigns)

        for line in storage.iter_lines(loc):
            lineno += 1
            if not line or (fmt == "criteo" and features.is_header(line)):
                continue
            if running % count == idx:
                chunk.append(line)
                linenos.append(lineno)
                budget.seen += 1
            running += 1
            if len(chunk) >= chunk_lines:
                b = take(chunk, linenos)
                chunk, linenos = [], []
                pend.append(b)
                pend_n += len(b)
                if pend_n >= batch_size:
                    yield from flush(False)
        if chunk:
            b = take(chunk, linenos)
            pend.append(b)
            pend_n += len(b)
    yield from flush(True)
    budget.finish()


def read_all(files: Sequence[str], fmt: str = "criteo", slots: Sequence[int] = features.DEFAULT_SLOTS,
             budget: BadLineBudget | None = None, limit: int | None = None,
             normalize: bool = True) -> Batch:
    """Reads whole inputs into one ``Batch`` (test sets); at most ``limit`` rows."""
    parts, n = [], 0
    for b in iter_batches(files, fmt, 65536, slots, budget=budget, normalize=normalize):
        parts.append(b)
        n += len(b)
        if limit is not None and n >= limit:
            break
    if not parts:
        raise ValueError(f"no valid rows in {list(files)}")
    out = Batch(np.concatenate([b.labels for b in parts]), np.concatenate([b.dense for b in parts]),
                np.concatenate([b.feasigns for b in parts]))
    if limit is not None:
        out = Batch(out.labels[:limit], out.dense[:limit], out.feasigns[:limit])
    return out
