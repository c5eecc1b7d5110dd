"""Hourly partitions of training data: the contract between whatever lands the data
(``elastic-ctr data generate --hours``, an upstream Hadoop/Spark job) and the trainer.

Layout (ElasticCTR's ``DATASET_PATH/<YYYYMMDD>/<HH>``, Hadoop's done marker)::

    ROOT/20261120/00/part-00000       data files: every name not starting with "_" or "."
    ROOT/20261120/00/_SUCCESS         written LAST: the partition is complete
    ROOT/20261120/01/...

``ROOT`` is a local directory, the file server's URL (listed through its JSON directory
listing) or an object-store / HDFS prefix (``s3://bucket/hours``, listed through fsspec),
all through ``runtime.storage``. An object store has no directories and no rename: the
partition's objects may appear one by one, so only the ``_SUCCESS`` object makes it count. An hour is written ``YYYYMMDD/HH`` (UTC), as in
ElasticCTR's ``START_DATE_HR`` / ``END_DATE_HR``. A partition without ``_SUCCESS`` is never
read, whatever files it already holds; a complete partition with no data file is an
error (an upstream job that wrote only the marker).
"""
from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass

from runtime import storage

DONE_MARKER = "_SUCCESS"
_HOUR_RE = re.compile(r"^(\d{8})/(\d{2})$")


class PartitionError(ValueError):
    """A bad hour, an incomplete or empty partition; the message names it."""


@dataclass(frozen=True, order=True)
class Hour:
    """One hourly partition, by its start time (UTC, whole hour)."""

    start: dt.datetime

    @classmethod
    def parse(cls, text: str, what: str = "hour") -> "Hour":
        """``"YYYYMMDD/HH"`` -> ``Hour``. Raises ``PartitionError`` naming ``what``."""
        m = _HOUR_RE.match(str(text).strip())
        if not m:
            raise PartitionError(f"{what} {text!r}: expected YYYYMMDD/HH, e.g. 20261120/00")
        try:
            t = dt.datetime.strptime(m.group(1) + m.group(2), "%Y%m%d%H").replace(tzinfo=dt.timezone.utc)
        except ValueError:
            raise PartitionError(f"{what} {text!r}: not a real date and hour") from None
        return cls(t)

    def __str__(self) -> str:
        return self.start.strftime("%Y%m%d/%H")

    def next(self, hours: int = 1) -> "Hour":
        """The hour ``hours`` later."""
        return Hour(self.start + dt.timedelta(hours=hours))

    def location(self, root: str) -> str:
        """``ROOT/YYYYMMDD/HH`` (path or URL)."""
        return storage.join(root, self.start.strftime("%Y%m%d"), self.start.strftime("%H"))


def hours(start: Hour, end: Hour) -> list[Hour]:
    """Every hour from ``start`` to ``end``, both included (empty if ``end < start``)."""
    out, h = [], start
    while h <= end:
        out.append(h)
        h = h.next()
    return out


def is_complete(root: str, hour: Hour) -> bool:
    """True once ``hour``'s done marker exists. Raises ``storage.LocationError`` for an
    unreachable root."""
    return storage.exists(storage.join(hour.location(root), DONE_MARKER))


def files(root: str, hour: Hour) -> list[str]:
    """The data files of a complete partition, sorted by name.

    Raises ``PartitionError`` when the partition is not complete or holds no data file."""
    loc = hour.location(root)
    if not is_complete(root, hour):
        raise PartitionError(f"partition {hour} ({loc}) is not complete: no {DONE_MARKER}")
    names = [n for n, kind in storage.list_dir(loc) if kind == "file" and not n.startswith(("_", "."))]
    if not names:
        raise PartitionError(f"partition {hour} ({loc}) is complete but holds no data file")
    return [storage.join(loc, n) for n in names]


def mark_complete(directory: str | os.PathLike) -> None:
    """Writes the (empty) done marker into a local partition directory, after its data."""
    with open(os.path.join(directory, DONE_MARKER), "wb"):
        pass
