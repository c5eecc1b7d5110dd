"""Features of the CTR model: the one owner of row parsing, the feasign function and the
dense normalization, used by the trainer's readers, serving and the demo client.

Input row formats
-----------------
* **Criteo** (Criteo Display Advertising Challenge): ``label I1..I13 C1..C26``, 40 fields
  separated by TAB (the raw dataset) or by ``,`` (the CSV variant with the header
  ``label,I1,...,I13,C1,...,C26``; a header line is skipped). ``label`` is ``0``/``1``;
  ``I*`` are integer counts (``260.0`` is accepted), empty = missing; ``C*`` are 32-bit
  categorical hashes written as 1..8 hex digits, empty = missing.
* **Slot** (ElasticCTR / PaddlePaddle Serving elastic-ctr ``data.txt``):
  ``show click feasign:slot feasign:slot ...``; ``feasign`` is a decimal uint64 already
  computed upstream, ``slot`` a decimal slot id. The label is ``click`` (> 0 -> 1). Only the
  slots of the slot list are used (a slot file: one slot id per line; default 1..26), the
  first feasign of a slot wins, a slot absent from the line gets that slot's *missing*
  feasign. The format carries no dense features: they are all missing (normalized to 0).

Feasign function (``FEASIGN_FUNCTION = "criteo_hex32_v1"``)
--------------------------------------------------------------
For slot ``s`` (1-based position of the categorical column, 1..26 for C1..C26) and raw
value ``v``::

    feasign(s, v) = (s << 33) | int(v, 16)          v = 1..8 hex digits  (bijective)
    feasign(s, "") = (s << 33) | (1 << 32)          missing value: one feasign per slot

A value with more than 8 hex digits or a non-hex character makes the line malformed.
The function is a bijection of (slot, value), so two slots never share a feasign, it is
stable across processes and versions (no hash seeds), and keys stay below 2**38. Slot
format rows carry their feasigns verbatim (function ``"slot_passthrough"``); a missing
slot there uses the same per-slot missing feasign as above.

Dense normalization (``NORMALIZATION``)
---------------------------------------
``x -> log1p(clip(x, 0, clip_max[i])) / log1p(clip_max[i])`` per feature ``i``, with NaN
(missing) -> 0; the result is in [0, 1]. ``clip_max`` are PaddleRec's Criteo bounds
(``models/rank/dnn`` reader, ``cont_max_``). The parameters are written to
``model_meta.json`` (``normalization``) so serving applies the same transform.

Everything here is vectorized over a batch of lines: ``parse_criteo_lines`` /
``parse_slot_lines`` return numpy arrays and the indices of malformed lines;
``parse_lines`` picks the parser by format. Serving accepts Criteo rows without the
label (39 fields): ``parse_criteo_lines(lines, label_optional=True)``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

NUM_DENSE = 13
NUM_SLOTS = 26
DEFAULT_SLOTS: tuple[int, ...] = tuple(range(1, NUM_SLOTS + 1))
FEASIGN_FUNCTION = "criteo_hex32_v1"
SLOT_FEASIGN_FUNCTION = "slot_passthrough"
SLOT_SHIFT = 33
MISSING_BIT = np.uint64(1 << 32)
CRITEO_FIELDS = 1 + NUM_DENSE + NUM_SLOTS  # 40

# PaddleRec models/rank/dnn criteo reader: cont_max_ (upper bound per dense feature).
CLIP_MAX = np.array([20, 600, 100, 50, 64000, 500, 100, 50, 500, 10, 10, 10, 50], dtype=np.float64)
NORMALIZATION = {
    "type": "log1p_clip_scale",
    "formula": "log1p(clip(x, 0, clip_max)) / log1p(clip_max); NaN -> 0",
    "clip_min": 0.0,
    "clip_max": CLIP_MAX.tolist(),
    "missing": 0.0,
}

# Hex digit value per byte (0..255); -1 = not a hex digit.
_HEX_LUT = np.full(256, -1, dtype=np.int64)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_LUT[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX_LUT[_c] = 10 + _i


class MalformedLine(ValueError):
    """A line that cannot be parsed; the message says which field and why."""


@dataclass
class ParsedBatch:
    """A batch of parsed rows.

    ``labels``: int64[n] (0/1); ``dense``: float32[n,13] raw values, NaN = missing;
    ``feasigns``: uint64[n,S] (S = number of slots, 26 by default); ``bad``: list of
    ``(index in the input lines, reason)`` for the malformed lines, which are left out of
    the arrays (rows keep the input order of the good lines).
    """

    labels: np.ndarray
    dense: np.ndarray
    feasigns: np.ndarray
    bad: list = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def missing_feasign(slot: int | np.ndarray) -> np.ndarray:
    """The feasign of a missing value of ``slot`` (int or int array) -> uint64."""
    return (np.asarray(slot, dtype=np.uint64) << np.uint64(SLOT_SHIFT)) | MISSING_BIT


def feasign(slot: int, value: str) -> int:
    """The feasign (python int in [0, 2**64)) of raw Criteo categorical ``value`` in ``slot``.

    ``value``: 1..8 hex digits, or ``""`` for missing. Raises ``MalformedLine`` otherwise.
    """
    if not 0 < slot < (1 << 31):
        raise MalformedLine(f"slot {slot} out of range 1..2**31-1")
    if value == "":
        return (slot << SLOT_SHIFT) | (1 << 32)
    if len(value) > 8:
        raise MalformedLine(f"categorical value {value!r} has more than 8 hex digits")
    try:
        v = int(value, 16)
    except ValueError:
        raise MalformedLine(f"categorical value {value!r} is not hex") from None
    if value.strip() != value or value.startswith(("-", "+", "0x", "0X")) or "_" in value:
        raise MalformedLine(f"categorical value {value!r} is not plain hex")
    return (slot << SLOT_SHIFT) | v


def feasigns_from_hex(values: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vectorized ``feasign``: ``values`` str/bytes[m] (hex, "" = missing), ``slots`` int[m].

    Returns ``(feasigns uint64[m], ok bool[m])``; ``ok`` is False where a value is not
    1..8 hex digits (its feasign is then meaningless).
    """
    b = np.asarray(values).astype("S9")  # 9 bytes: a 9th byte flags an over-long value
    m = b.shape[0]
    raw = np.frombuffer(b.tobytes(), dtype=np.uint8).reshape(m, 9)
    length = np.count_nonzero(raw, axis=1)
    nib = _HEX_LUT[raw]
    pos = np.arange(9)[None, :]
    inside = pos < length[:, None]
    ok = (length <= 8) & np.all(~inside | (nib >= 0), axis=1)
    acc = np.zeros(m, dtype=np.uint64)
    for p in range(8):
        use = inside[:, p]
        acc = np.where(use, (acc << np.uint64(4)) | np.maximum(nib[:, p], 0).astype(np.uint64), acc)
    sl = np.asarray(slots, dtype=np.uint64) << np.uint64(SLOT_SHIFT)
    out = np.where(length == 0, sl | MISSING_BIT, sl | acc)
    return out.astype(np.uint64), ok


def normalize_dense(dense: np.ndarray, clip_max: Sequence[float] | np.ndarray = CLIP_MAX) -> np.ndarray:
    """The dense normalization (module docstring): float[n,13] raw (NaN = missing) ->
    float32[n,13] in [0, 1]. ``clip_max``: float[13] upper bounds (a model's
    ``model_meta.json`` records the ones it was trained with). One float64 copy of the
    batch, transformed in place (bit for bit the values of clip-then-log1p on copies, with
    no copy per step). Raises ``ValueError`` for another shape."""
    x = np.array(dense, dtype=np.float64)  # one float64 copy, then every step in place
    if x.ndim != 2 or x.shape[1] != NUM_DENSE:
        raise ValueError(f"dense features: expected shape [n,{NUM_DENSE}], got {x.shape}")
    hi = np.asarray(clip_max, dtype=np.float64)
    np.fmax(x, 0.0, out=x)  # NaN (missing), -inf and negatives -> 0
    np.minimum(x, hi, out=x)  # +inf -> clip_max
    np.log1p(x, out=x)
    np.divide(x, np.log1p(hi), out=x)
    return x.astype(np.float32)


def _split(line: str) -> list[str]:
    return line.split("\t") if "\t" in line else line.split(",")


def is_header(line: str) -> bool:
    """True for the CSV header line (``label,I1,...``)."""
    return line.startswith("label")


def parse_criteo_line(line: str) -> tuple[int, np.ndarray, np.ndarray]:
    """One Criteo row (TSV or CSV) -> ``(label int, dense float32[13] raw with NaN for
    missing, feasigns uint64[26])``. Raises ``MalformedLine`` naming the bad field."""
    b = parse_criteo_lines([line])
    if b.bad:
        raise MalformedLine(b.bad[0][1])
    return int(b.labels[0]), b.dense[0], b.feasigns[0]


def _criteo_one(fields: list[str]) -> tuple[int, list[float], list[str]]:
    if len(fields) != CRITEO_FIELDS:
        raise MalformedLine(f"expected {CRITEO_FIELDS} fields, got {len(fields)}")
    if fields[0] not in ("0", "1"):
        raise MalformedLine(f"label {fields[0]!r} is not 0 or 1")
    dense = []
    for i, f in enumerate(fields[1:1 + NUM_DENSE]):
        if f == "":
            dense.append(np.nan)
            continue
        try:
            v = float(f)
        except ValueError:
            raise MalformedLine(f"I{i + 1} {f!r} is not a number") from None
        if not np.isfinite(v) or v != int(v):
            raise MalformedLine(f"I{i + 1} {f!r} is not an integer")
        dense.append(v)
    cats = fields[1 + NUM_DENSE:]
    for i, c in enumerate(cats):
        feasign(i + 1, c)  # raises on bad hex
    return int(fields[0]), dense, cats


def _prepend_label(line: str) -> str:
    """A Criteo row without its label (39 fields) gets label ``0``; other rows pass as they are."""
    sep = "\t" if "\t" in line else ","
    return "0" + sep + line if line.count(sep) == CRITEO_FIELDS - 2 else line


def parse_criteo_lines(lines: Sequence[str], label_optional: bool = False,
                       strict: bool = False) -> ParsedBatch:
    """A batch of Criteo rows (TSV or CSV) -> ``ParsedBatch`` (labels int64[n], dense
    float32[n,13] raw, feasigns uint64[n,26], bad [(line index, reason)]).

    ``label_optional``: a row of 39 fields (no label) is read with label 0 (serving's
    inputs). ``strict``: blank and header lines are reported in ``bad`` (every line must be
    a sample); otherwise they are dropped silently (a CSV file's header, trailing blanks).
    Fast path: split + numpy conversion of the whole batch; if anything fails, lines are
    checked one by one to name the bad ones.
    """
    if label_optional:
        lines = [_prepend_label(ln) for ln in lines]
    idx = [i for i, ln in enumerate(lines) if ln and not ln.isspace() and not is_header(ln)]
    keep = [lines[i] for i in idx] if len(idx) != len(lines) else list(lines)
    n = len(keep)
    bad: list = []
    if strict and len(idx) != len(lines):
        kept = set(idx)
        bad = [(i, "a header line is not a sample" if ln and is_header(ln) else "empty line")
               for i, ln in enumerate(lines) if i not in kept]
    try:
        if n == 0:
            raise ValueError
        sep = "\t" if "\t" in keep[0] else ","
        if any(ln.count(sep) != CRITEO_FIELDS - 1 for ln in keep):
            raise ValueError
        arr = np.array(sep.join(keep).encode().split(sep.encode())).reshape(n, CRITEO_FIELDS)
        lab = arr[:, 0]
        if not np.all((lab == b"0") | (lab == b"1")):
            raise ValueError
        orig = arr[:, 1:1 + NUM_DENSE]
        empty = orig == b""
        dstr = orig.astype(f"S{max(3, orig.dtype.itemsize)}")
        dstr[empty] = b"nan"
        dense = dstr.astype(np.float64)
        if np.any(np.isnan(dense) != empty) or np.any(np.isinf(dense)):
            raise ValueError  # a literal nan/inf is not an integer count
        if np.any(~empty & (dense != np.round(dense))):
            raise ValueError
        cats = arr[:, 1 + NUM_DENSE:]
        slots = np.broadcast_to(np.arange(1, NUM_SLOTS + 1), cats.shape)
        fs, ok = feasigns_from_hex(cats.ravel(), slots.ravel())
        if not ok.all():
            raise ValueError
        return ParsedBatch((lab == b"1").astype(np.int64), dense.astype(np.float32),
                           fs.reshape(n, NUM_SLOTS), bad)
    except ValueError:
        pass
    rows = [_split(lines[i]) for i in idx]
    # Slow path: find the malformed lines.
    labels, dense_l, cat_l = [], [], []
    for i, r in zip(idx, rows):
        try:
            lab, d, c = _criteo_one(r)
        except MalformedLine as exc:
            bad.append((i, str(exc)))
            continue
        labels.append(lab)
        dense_l.append(d)
        cat_l.append(c)
    m = len(labels)
    if m:
        cats = np.array(cat_l, dtype=str)
        slots = np.broadcast_to(np.arange(1, NUM_SLOTS + 1), cats.shape)
        fs, _ = feasigns_from_hex(cats.ravel(), slots.ravel())
        fs = fs.reshape(m, NUM_SLOTS)
    else:
        fs = np.zeros((0, NUM_SLOTS), dtype=np.uint64)
    return ParsedBatch(np.array(labels, dtype=np.int64),
                       np.array(dense_l, dtype=np.float32).reshape(m, NUM_DENSE), fs,
                       sorted(bad))


def load_slots(text: str) -> tuple[int, ...]:
    """Parses a slot file's content (one decimal slot id per line; blank lines and ``#``
    comments ignored) -> tuple of slot ids. Raises ``ValueError`` naming the bad line."""
    out = []
    for n, ln in enumerate(text.splitlines(), 1):
        ln = ln.split("#", 1)[0].strip()
        if not ln:
            continue
        try:
            out.append(int(ln))
        except ValueError:
            raise ValueError(f"slot file line {n}: {ln!r} is not a slot id") from None
    if not out:
        raise ValueError("slot file lists no slots")
    if len(set(out)) != len(out):
        raise ValueError("slot file lists a slot twice")
    return tuple(out)


def parse_slot_line(line: str, slots: Sequence[int] = DEFAULT_SLOTS) -> tuple[int, np.ndarray, np.ndarray]:
    """One slot-format row -> ``(label int, dense float32[13] all NaN, feasigns
    uint64[len(slots)])``. Raises ``MalformedLine``."""
    b = parse_slot_lines([line], slots)
    if b.bad:
        raise MalformedLine(b.bad[0][1])
    return int(b.labels[0]), b.dense[0], b.feasigns[0]


def parse_slot_lines(lines: Sequence[str], slots: Sequence[int] = DEFAULT_SLOTS,
                     strict: bool = False) -> ParsedBatch:
    """A batch of slot-format rows -> ``ParsedBatch`` (feasigns uint64[n,len(slots)],
    dense all NaN). Blank lines are dropped (``strict``: reported in ``bad``); malformed
    ones reported in ``bad``."""
    pos = {int(s): j for j, s in enumerate(slots)}
    ns = len(slots)
    miss = missing_feasign(np.asarray(slots, dtype=np.int64))
    labels, fs_rows, bad = [], [], []
    for i, ln in enumerate(lines):
        if not ln or ln.isspace():
            if strict:
                bad.append((i, "empty line"))
            continue
        parts = ln.split()
        try:
            if len(parts) < 2:
                raise MalformedLine("expected 'show click feasign:slot ...'")
            try:
                int(parts[0])
                click = int(parts[1])
            except ValueError:
                raise MalformedLine(f"show/click {parts[0]!r} {parts[1]!r} not integers") from None
            row = miss.copy()
            seen = set()
            for tok in parts[2:]:
                f, sep, s = tok.partition(":")
                if not sep:
                    raise MalformedLine(f"token {tok!r} is not feasign:slot")
                try:
                    fv, sv = int(f), int(s)
                except ValueError:
                    raise MalformedLine(f"bad feasign {tok!r}") from None
                if not 0 <= fv < (1 << 64):
                    raise MalformedLine(f"feasign {f} out of uint64 range")
                j = pos.get(sv)
                if j is not None and sv not in seen:
                    row[j] = np.uint64(fv)
                    seen.add(sv)
        except MalformedLine as exc:
            bad.append((i, str(exc)))
            continue
        labels.append(1 if click > 0 else 0)
        fs_rows.append(row)
    n = len(labels)
    fs = np.array(fs_rows, dtype=np.uint64).reshape(n, ns)
    dense = np.full((n, NUM_DENSE), np.nan, dtype=np.float32)
    return ParsedBatch(np.array(labels, dtype=np.int64), dense, fs, bad)


_SLOT_ROW = re.compile(r"^\s*\d+\s+\d+\s+\d+:\d+")
FORMATS = ("criteo", "slot")


def detect_format(line: str) -> str:
    """``"slot"`` for a ``show click feasign:slot ...`` row, else ``"criteo"``."""
    return "slot" if _SLOT_ROW.match(line) else "criteo"


def parse_lines(lines: Sequence[str], fmt: str = "criteo", slots: Sequence[int] = DEFAULT_SLOTS,
                label_optional: bool = False, strict: bool = False) -> ParsedBatch:
    """Rows of format ``fmt`` (``criteo`` | ``slot``) -> ``ParsedBatch``; the flags are those of
    ``parse_criteo_lines`` (slot rows always carry their label). Raises ``ValueError`` for
    an unknown format."""
    if fmt == "criteo":
        return parse_criteo_lines(lines, label_optional=label_optional, strict=strict)
    if fmt == "slot":
        return parse_slot_lines(lines, slots, strict=strict)
    raise ValueError(f"unknown data format {fmt!r} (expected one of {', '.join(FORMATS)})")
