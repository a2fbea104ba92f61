"""Writing output files atomically: a reader (or `t10c run`) sees an old file or a new one,
an old compile directory or a new one, never a mix, even when t10c is interrupted or the disk
fills up.

A file is written to a temporary sibling and renamed over its target (`os.replace` is atomic
on one file system); a directory is filled as a temporary sibling and swapped in at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


class OutputError(OSError):
    """An output that could not be written; the message names it and says why."""


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary sibling renamed into place."""
    with replacing(path) as tmp:
        tmp.write_text(text)


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary file next to ``path`` to write; renamed over ``path`` when the block ends
    without an exception, removed otherwise."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
        os.replace(tmp, path)
    except OutputError:
        tmp.unlink(missing_ok=True)
        raise
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def directory(path: Path) -> Iterator[Path]:
    """A temporary directory next to ``path`` to fill; it replaces ``path`` (and whatever
    was in it) when the block ends without an exception, and is removed otherwise."""
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        _swap(tmp, path)
    except OutputError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap(new: Path, path: Path) -> None:
    """Put directory ``new`` at ``path``: the old one is renamed aside first, so that at every
    moment ``path`` is the old compile, the new one, or absent."""
    if not path.exists():
        os.replace(new, path)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
    os.replace(path, old / path.name)
    os.replace(new, path)
    shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
