"""The files the ``deepboot`` command writes: atomically, and never onto its inputs.

Contract of :func:`write_atomic` (and of :func:`write_text` and :func:`write_bytes`):

* The content goes to a new temporary file in the target's own directory (so the
  rename cannot cross file systems), which is flushed and ``fsync``-ed, then renamed
  over the target with :func:`os.replace`, and the directory is ``fsync``-ed (where
  the platform allows it). A reader sees the old file or the new one, never a part.
* If anything fails (``OSError``: a full disk, a file-size limit, a missing or
  read-only directory), the previous file, if there was one, is left untouched, the
  temporary file is removed, and an :class:`~deepboot.core.errors.InputError`
  naming the target, ``<path>: cannot write: <reason>``, is raised (the CLI prints it
  as one line and exits 2). Any other exception also removes the temporary file.
* A symbolic link as the target is kept: the file it points to is replaced. An
  existing target's permission bits carry over; a new file gets ``0o666`` less the
  umask, as :func:`open` would give it.

The checks run before any work, so that a run is refused before it starts:

* :func:`require_path`: an empty or blank path argument is an error, never "the
  default";
* :func:`check_outputs`: no output may be one of the run's inputs (same real path,
  through symbolic links, or the same file through a hard link) or lie inside an
  input directory (a profile directory), and no output may be an existing directory.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from deepboot.core.errors import ConfigError, InputError


def write_atomic(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Write ``path`` atomically: ``write(tmp)`` fills a temporary file, then it is
    flushed, synced and renamed over ``path`` (see the module docstring).

    Args:
        path: The target file.
        write: Writes the whole content to the path it is given (and closes it).

    Returns:
        ``path``, as a :class:`Path`.

    Raises:
        InputError: the file cannot be written; the previous one is left intact.
    """
    target = Path(path)
    real = Path(os.path.realpath(target))
    tmp: Path | None = None
    try:
        real.parent.mkdir(parents=True, exist_ok=True)  # as mkdir -p: out/x.json
        tmp = _create_temporary(real)
        write(tmp)
        fd = os.open(tmp, os.O_RDWR)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, real)
        tmp = None
        _sync_directory(real.parent)
    except OSError as exc:
        raise InputError(str(target), 0, "", f"cannot write: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
    return target


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; see :func:`write_atomic`."""
    return write_atomic(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; see :func:`write_atomic`."""
    return write_atomic(path, lambda p: p.write_bytes(data))


def _create_temporary(real: Path) -> Path:
    """A new, empty file next to ``real``, with the permission bits it should end with."""
    try:
        mode: int | None = real.stat().st_mode & 0o7777
    except OSError:
        mode = None
    for _ in range(100):
        tmp = real.with_name(f".{real.name}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        try:
            if mode is not None:
                os.fchmod(fd, mode)
        except OSError:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        return tmp
    raise FileExistsError(f"no free temporary name next to {real}")


def _sync_directory(directory: Path) -> None:
    """Make the rename durable; a no-op where directories cannot be opened or synced."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ------------------------------------------------------------------ checks


def require_path(value: str | None, flag: str) -> str:
    """``value`` itself, or a :class:`ConfigError` if it is empty or blank.

    An unset shell variable (``--out "$OUT"``) must not silently mean the default.
    """
    if value is None or not value.strip():
        raise ConfigError(f"{flag} is empty; give a path (an unset shell variable?)")
    return value


@dataclass(frozen=True, slots=True)
class PathArg:
    """A path given on the command line and the flag it came with (for messages)."""

    flag: str
    path: str

    def __str__(self) -> str:
        return f"{self.flag} {self.path}"


def input_files(arg: PathArg) -> list[PathArg]:
    """``arg`` and, if it is a directory, every file under it (for :func:`check_outputs`)."""
    found = [arg]
    if os.path.isdir(arg.path):
        for root, dirs, files in os.walk(arg.path):
            dirs.sort()
            found += [PathArg(arg.flag, os.path.join(root, f)) for f in sorted(files)]
    return found


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` name one file: the same real path (through symbolic
    links), or, when both exist, the same file (through hard links)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def _inside(path: str, directory: str) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(directory)
    return real != top and os.path.commonpath([real, top]) == top


def shipped_catalog() -> Path:
    """The catalog shipped inside the package (``deepboot/perf/catalog.json``)."""
    import deepboot.perf

    return Path(deepboot.perf.__file__).parent / "catalog.json"


def model_inputs(profiles: str | None) -> list[PathArg]:
    """What a run reads its models from: ``--profiles DIR``, or the shipped catalog."""
    if profiles is None:
        return [PathArg("built-in catalog", str(shipped_catalog()))]
    return [PathArg("--profiles", profiles)]


def check_outputs(
    outputs: Sequence[PathArg], inputs: Iterable[PathArg], need_directory: bool = True
) -> None:
    """Refuse outputs that would overwrite an input of the same run.

    Args:
        outputs: Every file the command may write.
        inputs: Every file or directory it reads (directories: see :func:`input_files`;
            an output inside an input directory is refused too).
        need_directory: Also refuse an output whose directory cannot be made: a
            file stands where one of its directories would be (a missing directory
            is made when the output is written, as ``mkdir -p``; False when the
            command makes its own folder).

    Raises:
        ConfigError: naming the output and the input, an output that is an existing
            directory, or (``need_directory``) one whose directory is blocked by a
            file.
    """
    expanded = [f for arg in inputs for f in input_files(arg)]
    for out in outputs:
        if os.path.isdir(out.path):
            raise ConfigError(f"{out} is a directory; give a file name")
        if need_directory:
            parent = Path(os.path.realpath(out.path)).parent
            blocked = next((d for d in (parent, *parent.parents) if d.exists()), None)
            if blocked is not None and not blocked.is_dir():
                raise ConfigError(f"{out}: {blocked} is a file, not a directory")
        for src in expanded:
            if same_file(out.path, src.path):
                raise ConfigError(
                    f"{out} would overwrite an input of this run, {src}; choose another output file"
                )
            if os.path.isdir(src.path) and _inside(out.path, src.path):
                raise ConfigError(f"{out} is inside the input directory {src}; write it elsewhere")
