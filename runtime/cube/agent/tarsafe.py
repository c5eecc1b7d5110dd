"""Safe unpacking of a downloaded shard tar (the agent's ``download`` step): a tar must be
whole (end-of-archive marker), and only regular files and directories that stay inside
the destination are unpacked; anything else raises ``AgentError(step="download")``.
"""
from __future__ import annotations

import os
import shutil
import tarfile
import threading
from pathlib import Path

from runtime.cube.agent.steps import AgentError

TAR_BLOCK = 512  # bytes per tar block (POSIX ustar)


def check_tar_complete(path: str | os.PathLike) -> None:
    """Raises ``AgentError(step="download")`` unless ``path`` looks like a whole tar: a size
    that is a multiple of 512 bytes ending with the two zero blocks of the end-of-archive
    marker (POSIX.1-1988 ustar; GNU tar and Python's tarfile both write it). This catches
    a tar truncated at a member boundary, which tarfile itself would read as complete."""
    size = os.path.getsize(path)
    if size < 2 * TAR_BLOCK or size % TAR_BLOCK:
        raise AgentError("download", f"{path}: truncated tar ({size} bytes, not a whole number "
                                     f"of {TAR_BLOCK}-byte blocks with an end-of-archive marker)")
    with open(path, "rb") as f:
        # the end marker is two zero blocks, possibly followed by zero padding to a record
        f.seek(max(0, size - 20 * TAR_BLOCK))
        tailb = f.read()
    stripped = tailb.rstrip(b"\0")
    zeros = len(tailb) - len(stripped)
    if zeros < 2 * TAR_BLOCK:
        raise AgentError("download", f"{path}: truncated tar (no end-of-archive marker)")


def safe_extract(tar_path: str | os.PathLike, dest: str | os.PathLike) -> list[str]:
    """Unpacks ``tar_path`` into the new directory ``dest`` (which must not exist).

    Every member is checked before anything is written: regular files and directories
    only, relative names that stay inside ``dest`` (no absolute path, no ``..``, no link,
    no device). Unpacks into a temporary sibling directory renamed to ``dest`` at the end,
    so ``dest`` appears whole or not at all. Returns the member names.

    Raises ``AgentError(step="download")`` naming the tar and the offending member, or
    for a truncated/corrupt tar.
    """
    tar_path, dest = Path(tar_path), Path(dest)
    check_tar_complete(tar_path)
    tmp = dest.parent / f".{dest.name}.unpack-{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    root = tmp.resolve()
    try:
        try:
            with tarfile.open(tar_path, "r:") as tf:
                members = tf.getmembers()
                for m in members:
                    name = m.name
                    if not (m.isfile() or m.isdir()):
                        raise AgentError("download", f"{tar_path}: member {name!r} is not a regular "
                                                     "file or directory (links and devices are refused)")
                    if name.startswith("/") or os.path.isabs(name) or ".." in Path(name).parts:
                        raise AgentError("download", f"{tar_path}: member {name!r} escapes the "
                                                     "unpack directory")
                    target = (root / name).resolve()
                    if target != root and root not in target.parents:
                        raise AgentError("download", f"{tar_path}: member {name!r} escapes the "
                                                     "unpack directory")
                # the checks above are ours (clear errors); the "data" filter is a second guard
                # where this Python has it (3.11.4+, 3.10.12+; Debian bookworm's 3.11.2 has not)
                if hasattr(tarfile, "data_filter"):
                    tf.extractall(root, members=members, filter="data")
                else:
                    for m in members:  # files and directories only, checked above
                        m.mode = (m.mode & 0o755) | (0o700 if m.isdir() else 0o600)
                        m.uid = m.gid = 0
                        m.uname = m.gname = ""
                    tf.extractall(root, members=members, numeric_owner=False)
                # tarfile reads member data lazily: a short member raises ReadError above
        except tarfile.TarError as exc:
            raise AgentError("download", f"{tar_path}: corrupt or truncated tar: {exc}") from exc
        except EOFError as exc:
            raise AgentError("download", f"{tar_path}: truncated tar: {exc}") from exc
        for m in members:
            if m.isfile():
                got = (root / m.name).stat().st_size
                if got != m.size:
                    raise AgentError("download", f"{tar_path}: member {m.name!r} truncated "
                                                 f"({got} of {m.size} bytes)")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
        return [m.name for m in members]
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def dict_dir_of(unpacked: Path) -> Path:
    """The directory to hand to the server: the tar's single top-level directory
    (``<dict>_part<i>/``, as the builder writes it) or the unpack root itself."""
    entries = [p for p in unpacked.iterdir() if not p.name.startswith(".")]
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return unpacked
