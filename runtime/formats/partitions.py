"""Partitions of training data, of any period from one minute to a day: the contract
between whatever lands the data (``elastic-ctr data generate --hours/--partitions``, an
upstream Hadoop/Spark job) and the trainer.

Two layouts, chosen by the period (minutes, ``--partition-minutes`` / stack key
``partitionMinutes``):

* **hourly** (a period of 60 minutes or a multiple of it; ElasticCTR's
  ``DATASET_PATH/<YYYYMMDD>/<HH>``, unchanged)::

      ROOT/20261120/00/part-00000       data files: every name not starting with "_" or "."
      ROOT/20261120/00/_SUCCESS         written LAST: the partition is complete
      ROOT/20261120/01/...

* **minute** (a period under 60 minutes that divides the hour: 1, 2, 3, 4, 5, 6, 10, 12,
  15, 20 or 30)::

      ROOT/20261120/0000/part-00000
      ROOT/20261120/0000/_SUCCESS
      ROOT/20261120/0001/...           (period 1; period 5: 0000, 0005, 0010, ...)

A partition is named by its start (UTC), ``YYYYMMDD/HH`` or ``YYYYMMDD/HHMM``, as its
directory; its start is a multiple of its period from midnight (a 120-minute period starts
at even hours). The names sort in time order within a layout. ``ROOT`` is a local
directory, the file server's URL (listed through its JSON directory listing) or an
object-store / HDFS prefix (``s3://bucket/hours``, listed through fsspec), all through
``runtime.storage``. An object store has no directories and no rename: the partition's
objects may appear one by one, so only the ``_SUCCESS`` object makes it count. A
partition without ``_SUCCESS`` is never read, whatever files it already holds; a complete
partition with no data file is an error (an upstream job that wrote only the marker).
"""
from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass

from runtime import storage

DONE_MARKER = "_SUCCESS"
HOURLY = 60
DAY = 24 * 60
_NAME_RE = re.compile(r"^(\d{8})/(\d{2})(\d{2})?$")


class PartitionError(ValueError):
    """A bad partition name or period, an incomplete or empty partition; the message names it."""


def check_period(minutes: int, what: str = "partition period") -> int:
    """``minutes`` when it is a valid period (module docstring: divides 60, or a multiple
    of 60 that divides a day); raises ``PartitionError`` naming ``what`` otherwise."""
    m = int(minutes)
    ok = (1 <= m < HOURLY and HOURLY % m == 0) or (m >= HOURLY and m % HOURLY == 0 and DAY % m == 0)
    if not ok or m != minutes:
        raise PartitionError(f"{what} {minutes!r}: minutes that divide an hour (1, 2, 3, 4, 5, 6, 10, 12, 15, "
                             "20, 30) or a multiple of 60 that divides a day (60, 120, 180, 240, 360, 480, 720, 1440)")
    return m


def layout(minutes: int) -> str:
    """The name pattern of ``minutes``' partitions: ``YYYYMMDD/HH`` or ``YYYYMMDD/HHMM``."""
    return "YYYYMMDD/HH" if check_period(minutes) >= HOURLY else "YYYYMMDD/HHMM"


@dataclass(frozen=True, order=True)
class Partition:
    """One partition: its start (UTC, aware) and period (minutes). Ordered by start (then
    period); ``str()`` is its name, ``location()`` its directory."""

    start: dt.datetime
    minutes: int = HOURLY

    def __post_init__(self) -> None:
        check_period(self.minutes)
        since_midnight = self.start.hour * 60 + self.start.minute
        if self.start.second or self.start.microsecond or since_midnight % self.minutes:
            raise PartitionError(f"partition start {self.start.isoformat()} is not on a {self.minutes}-minute "
                                 "boundary")

    @classmethod
    def parse(cls, text: str, what: str = "partition", minutes: int = HOURLY) -> "Partition":
        """``"YYYYMMDD/HH"`` (any period: the hour's start) or ``"YYYYMMDD/HHMM"`` (a period
        under 60) -> ``Partition`` of ``minutes``. Raises ``PartitionError`` naming ``what``
        for a malformed name, a date or time that does not exist, a minute form with an
        hourly period, or a start off the period's boundary."""
        minutes = check_period(minutes, f"{what}: period")
        m = _NAME_RE.match(str(text).strip())
        expect = layout(minutes)
        if not m or (m.group(3) is not None and minutes >= HOURLY):
            raise PartitionError(f"{what} {text!r}: expected {expect}, e.g. "
                                 f"{'20261120/00' if minutes >= HOURLY else '20261120/0000'}")
        try:
            t = dt.datetime.strptime(m.group(1) + m.group(2) + (m.group(3) or "00"),
                                     "%Y%m%d%H%M").replace(tzinfo=dt.timezone.utc)
        except ValueError:
            raise PartitionError(f"{what} {text!r}: not a real date and time") from None
        try:
            return cls(t, minutes)
        except PartitionError as exc:
            raise PartitionError(f"{what} {text!r}: {exc}") from None

    @property
    def seconds(self) -> int:
        """The period in seconds."""
        return self.minutes * 60

    @property
    def end(self) -> dt.datetime:
        """The start of the next partition."""
        return self.start + dt.timedelta(minutes=self.minutes)

    def __str__(self) -> str:
        return self.start.strftime("%Y%m%d/%H" if self.minutes >= HOURLY else "%Y%m%d/%H%M")

    def next(self, n: int = 1) -> "Partition":
        """The partition ``n`` periods later (earlier when negative)."""
        return Partition(self.start + dt.timedelta(minutes=self.minutes * n), self.minutes)

    def location(self, root: str) -> str:
        """``ROOT/YYYYMMDD/HH`` or ``ROOT/YYYYMMDD/HHMM`` (path or URL)."""
        day, rest = str(self).split("/")
        return storage.join(root, day, rest)


Hour = Partition  # an hourly partition: Partition with its default period


def span(start: Partition, end: Partition) -> list[Partition]:
    """Every partition from ``start`` to ``end`` (``start``'s period), both included
    (empty if ``end < start``)."""
    out, p = [], start
    while p.start <= end.start:
        out.append(p)
        p = p.next()
    return out


hours = span  # the hourly name of span


def is_complete(root: str, part: Partition) -> bool:
    """True once ``part``'s done marker exists. Raises ``storage.LocationError`` for an
    unreachable root."""
    return storage.exists(storage.join(part.location(root), DONE_MARKER))


def files(root: str, part: Partition) -> list[str]:
    """The data files of a complete partition, sorted by name.

    Raises ``PartitionError`` when the partition is not complete or holds no data file."""
    loc = part.location(root)
    if not is_complete(root, part):
        raise PartitionError(f"partition {part} ({loc}) is not complete: no {DONE_MARKER}")
    names = [n for n, kind in storage.list_dir(loc) if kind == "file" and not n.startswith(("_", "."))]
    if not names:
        raise PartitionError(f"partition {part} ({loc}) is complete but holds no data file")
    return [storage.join(loc, n) for n in names]


def mark_complete(directory: str | os.PathLike) -> None:
    """Writes the (empty) done marker into a local partition directory, after its data."""
    with open(os.path.join(directory, DONE_MARKER), "wb"):
        pass
