"""MultiSlot text: the rows the trainer hands to Paddle's dataset (``InMemoryDataset`` with
``MultiSlotInMemoryDataFeed``), the one owner of that format. The writer is ``encode``
(``runtime.trainer.dataset`` stages every input through it); the reader is Paddle's C++
data feed, which ``decode`` mirrors for the tests.

Format (PaddlePaddle ``paddle/fluid/framework/data_feed.cc``,
``MultiSlotInMemoryDataFeed::ParseOneInstanceFromPipe``): one example per line; for each
variable of the dataset's ``use_var`` list, in that order, ``<count> <value>...``, fields
separated by white space. The count is read with ``strtol``, float values with ``strtof``
and uint64 values with ``strtoull(..., 10)``, so leading zeros and a leading ``+`` are
accepted. Our variables (``use_var_names``): ``dense_input`` (float, 13 values),
``C1``..``C<S>`` (uint64, 1 value each: the slot's feasign, or the row of a local table)
and ``label`` (uint64, 1 value: 0 or 1).

``encode`` writes fixed-width fields so that a whole batch is formatted with numpy array
operations (no per-row Python): ids zero-padded to the widest id of the batch, dense
values as ``<sign><integer part, zero-padded>.<9 decimals>``. A dense value is written to
within 5e-10 (absolute); ids are exact.
"""
from __future__ import annotations

import numpy as np

DENSE_VAR = "dense_input"
LABEL_VAR = "label"
DENSE_DECIMALS = 9
_SCALE = 10 ** DENSE_DECIMALS
MAX_ABS_DENSE = 1e9  # the fixed-point encoding holds |x| < 1e9
_ZERO, _SPACE, _NL, _DOT = ord("0"), ord(" "), ord("\n"), ord(".")


def slot_var(i: int) -> str:
    """The name of slot ``i``'s id variable (0-based ``i`` -> ``C<i+1>``)."""
    return f"C{i + 1}"


def use_var_names(num_slots: int) -> list[str]:
    """The dataset's ``use_var`` names in line order: dense, ``C1``..``C<num_slots>``, label."""
    return [DENSE_VAR] + [slot_var(i) for i in range(num_slots)] + [LABEL_VAR]


def _digits(values: np.ndarray, width: int) -> np.ndarray:
    """uint64[m] -> uint8[m, width]: ASCII decimal digits, zero-padded on the left."""
    v = values.astype(np.uint64, copy=True)
    out = np.empty((v.shape[0], width), dtype=np.uint8)
    ten = np.uint64(10)
    for k in range(width - 1, -1, -1):
        out[:, k] = (v % ten).astype(np.uint8) + _ZERO
        v //= ten
    return out


def _width(max_value: int) -> int:
    return len(str(int(max_value))) if max_value > 0 else 1


def _block(mat: np.ndarray, start: int, count: int, width: int) -> np.ndarray:
    """A writable (n, count, width) view of columns ``start .. start+count*width`` of
    ``mat`` (uint8[n, L])."""
    view = mat[:, start:start + count * width]
    view.shape = (mat.shape[0], count, width)  # raises rather than copying
    return view


def encode(dense: np.ndarray, ids: np.ndarray, labels: np.ndarray) -> bytes:
    """Formats a batch as MultiSlot text lines (module docstring).

    Args:
        dense: float32[n, D] dense features (finite, ``|x| < 1e9``).
        ids: uint64[n, S] one id per slot (feasigns, or rows of a local table); 0 is a
            valid id here, but Paddle's feed drops a 0 of a sparse slot, so callers keep 0
            for "no id" (the single-process table's zero row).
        labels: int[n], each 0 or 1.

    Returns the UTF-8 bytes of ``n`` lines, each ending in ``\\n`` (``b""`` for n = 0).

    Raises:
        ValueError: shapes disagree, a dense value is NaN, infinite or too large, or a
            label is not 0/1 (the message names the first offending row).
    """
    dense = np.asarray(dense)
    ids = np.asarray(ids)
    labels = np.asarray(labels).reshape(-1)
    n = labels.shape[0]
    if dense.ndim != 2 or ids.ndim != 2 or dense.shape[0] != n or ids.shape[0] != n:
        raise ValueError(f"MultiSlot batch: dense {dense.shape}, ids {ids.shape}, labels {labels.shape} "
                         "do not describe the same rows")
    if n == 0:
        return b""
    d = dense.astype(np.float64)
    bad = ~np.isfinite(d) | (np.abs(d) >= MAX_ABS_DENSE)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise ValueError(f"MultiSlot batch: dense value {float(d[r, c])!r} at row {r}, column {c} is not "
                         f"finite or not below {MAX_ABS_DENSE:g} in magnitude")
    if not np.isin(labels, (0, 1)).all():
        r = int(np.flatnonzero(~np.isin(labels, (0, 1)))[0])
        raise ValueError(f"MultiSlot batch: label {labels[r].item()!r} at row {r} is not 0 or 1")
    ids = ids.astype(np.uint64, copy=False)
    num_dense, num_slots = d.shape[1], ids.shape[1]
    mag = np.rint(np.abs(d) * _SCALE).astype(np.uint64)
    int_part, frac_part = mag // np.uint64(_SCALE), mag % np.uint64(_SCALE)
    wi = _width(int(int_part.max()))
    wk = _width(int(ids.max()))
    head = f"{num_dense} ".encode()
    dense_w = 1 + wi + 1 + DENSE_DECIMALS + 1  # sign, integer, '.', decimals, ' '
    slot_w = 2 + wk + 1                          # "1 ", digits, ' '
    tail = b"1 0\n"                              # label count, label, newline
    dense_at = len(head)
    slots_at = dense_at + num_dense * dense_w
    label_at = slots_at + num_slots * slot_w
    row = np.full(label_at + len(tail), _SPACE, dtype=np.uint8)
    row[:len(head)] = np.frombuffer(head, np.uint8)
    row[label_at:] = np.frombuffer(tail, np.uint8)
    mat = np.tile(row, (n, 1))
    db = _block(mat, dense_at, num_dense, dense_w)
    db[:, :, 0] = np.where(d < 0, ord("-"), ord("+"))
    db[:, :, 1:1 + wi] = _digits(int_part.ravel(), wi).reshape(n, num_dense, wi)
    db[:, :, 1 + wi] = _DOT
    db[:, :, 2 + wi:2 + wi + DENSE_DECIMALS] = _digits(frac_part.ravel(), DENSE_DECIMALS).reshape(
        n, num_dense, DENSE_DECIMALS)
    if num_slots:
        sb = _block(mat, slots_at, num_slots, slot_w)
        sb[:, :, 0] = ord("1")
        sb[:, :, 2:2 + wk] = _digits(ids.ravel(), wk).reshape(n, num_slots, wk)
    mat[:, label_at + 2] = labels.astype(np.uint8) + _ZERO
    return mat.tobytes()


def decode(text: bytes, num_dense: int, num_slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parses MultiSlot lines as Paddle's feed does for our ``use_var`` list (a mirror for
    tests and tools, not used in training).

    Returns ``(labels int64[n], dense float32[n, num_dense], ids uint64[n, num_slots])``.
    Raises ``ValueError`` naming the line (1-based) whose counts or values do not match
    the variables.
    """
    labels, dense, ids = [], [], []
    for lineno, line in enumerate(text.decode().splitlines(), 1):
        f = line.split()
        try:
            pos = 0
            counts = []

            def take(kind):
                nonlocal pos
                c = int(f[pos])
                vals = f[pos + 1:pos + 1 + c]
                if len(vals) != c:
                    raise ValueError("too few values")
                pos += 1 + c
                counts.append(c)
                return [float(v) for v in vals] if kind == "f" else [int(v, 10) for v in vals]

            dv = take("f")
            sv = [take("u") for _ in range(num_slots)]
            lv = take("u")
        except (ValueError, IndexError) as exc:
            raise ValueError(f"MultiSlot line {lineno}: {exc}") from None
        if pos != len(f) or len(dv) != num_dense or any(len(s) != 1 for s in sv) or len(lv) != 1:
            raise ValueError(f"MultiSlot line {lineno}: counts {counts} do not match dense {num_dense}, "
                             f"{num_slots} slots of 1 id and 1 label")
        dense.append(dv)
        ids.append([s[0] for s in sv])
        labels.append(lv[0])
    return (np.asarray(labels, dtype=np.int64).reshape(-1),
            np.asarray(dense, dtype=np.float32).reshape(-1, num_dense),
            np.asarray(ids, dtype=np.uint64).reshape(-1, num_slots))
