"""Typed errors. Each one says what is wrong and what to fix."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from contextlib import contextmanager


class DeepbootError(Exception):
    """Base class of every error deepboot raises on purpose."""


class InputError(DeepbootError):
    """Bad user input: a trace, workload or profile file.

    Attributes:
        path: The file that holds the bad input.
        line: 1-based line number in ``path`` (0 when the whole file is at fault).
        field: The column or field name at fault ("" when not applicable).
        message: What is wrong, in words a user can act on.
    """

    def __init__(self, path: str, line: int, field: str, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.path if self.line <= 0 else f"{self.path}:{self.line}"
        what = f" field '{self.field}':" if self.field else ""
        return f"{where}:{what} {self.message}"


class ConfigError(DeepbootError):
    """A configuration value (CLI flag, policy parameter) is invalid."""


class UnknownPolicyError(ConfigError):
    """A policy name is not in the registry."""


class InvalidDecisionError(DeepbootError):
    """A scheduling decision breaks an invariant; nothing of it was applied."""


class UnschedulableError(ConfigError):
    """A job can never run: its smallest size exceeds every GPU its policy may use."""


class SimulationStalledError(DeepbootError):
    """A simulation stopped making progress (jobs wait, nothing can change), or its
    clock can no longer advance."""


@contextmanager
def csv_read_errors(spath: str, kind: str) -> Iterator[None]:
    """Map OS, decoding and csv-module errors raised inside the block to ``InputError``.

    Args:
        spath: The file's path, as shown to the user.
        kind: What the file should be, for the directory case ("a workload CSV file").

    Raises:
        InputError: naming ``spath`` (line 0: the file as a whole). InputErrors raised
            inside the block pass through unchanged.
    """
    try:
        yield
    except FileNotFoundError:
        raise InputError(spath, 0, "", "file not found") from None
    except IsADirectoryError:
        raise InputError(spath, 0, "", f"is a directory, not {kind}") from None
    except UnicodeDecodeError as exc:
        raise InputError(spath, 0, "", f"not a UTF-8 text file ({exc.reason})") from None
    except csv.Error as exc:
        raise InputError(spath, 0, "", f"malformed CSV: {exc}") from None
    except OSError as exc:
        raise InputError(spath, 0, "", f"cannot read: {exc.strerror or exc}") from None
