"""Turn the ways reading a CSV file can fail into one-line ``InputError``s."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from contextlib import contextmanager

from deepboot.core.errors import InputError


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
