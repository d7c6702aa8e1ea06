"""Is a path ours? The checks that keep another local user's preparations out of the
state directory (issue 42, finding 1).

The threat: another user of the machine creates the state directory first (in a
shared directory such as ``/tmp``, or a shared working directory), or plants a token
file or a symlink in it, then waits for us to run ``deepboot up`` there. If we used
their directory or their token, they would hold the token of our controller, and with
it code execution as us.

The rule, in the spirit of OpenSSH's ``StrictModes``:

* every existing ancestor of the path is owned by us or root and is writable by
  nobody else, unless it is sticky (``/tmp``: then others cannot rename or remove
  what we own in it). So once the checks pass, no other user can swap a component of
  the path for something of theirs: the check stays true after it is made;
* the directory itself (and each directory under it that we use) is a directory, not
  a symlink, owned by us, writable by nobody else;
* a secret file (a token, the token as a header, the endpoint record) is a regular
  file, not a symlink, owned by us, mode exactly 0600; any other file we read or
  append to is a regular file owned by us and writable by nobody else.

Every check is a pure function of what ``lstat``/``stat`` answer (injectable: the
tests hand in a fake) and of the effective uid. Each failure is an
:class:`UnsafePathError` whose message is one line naming the path and its owner.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Callable
from pathlib import Path

from deepboot.core.errors import DeepbootError

StatFn = Callable[[str], os.stat_result]
"""``os.lstat``-like: what the path itself is (a symlink is not followed)."""

SECRET_MODE = 0o600
"""The only mode a secret file may have."""

_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


class UnsafePathError(DeepbootError):
    """A path is not safely ours: another user owns it, or could change it, or it is a
    symlink. Nothing in it was read or changed."""


def owner_name(uid: int) -> str:
    """``"name (uid N)"``, or ``"uid N"`` for a uid without a user."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _refuse(path: str | Path, what: str, why: str) -> UnsafePathError:
    return UnsafePathError(f"refusing {what} {path}: {why}")


def _not_ours(path: str | Path, what: str, st: os.stat_result, euid: int) -> UnsafePathError:
    return _refuse(
        path,
        what,
        f"owned by {owner_name(st.st_uid)}, not by {owner_name(euid)} (another user "
        "may have prepared it; remove it, or choose another path)",
    )


def check_ancestors(path: str | Path, euid: int, lstat: StatFn = os.lstat) -> None:
    """Every existing ancestor of ``path`` (its parent up to ``/``) is owned by ``euid``
    or root and writable by nobody else unless sticky. A symlink among them is allowed
    only when owned by ``euid`` or root; the ancestors of the resolved path are then
    checked too (:func:`os.path.realpath`), so where it points obeys the same rule.

    Raises:
        UnsafePathError: naming ``path``, the first ancestor that fails, and why.
    """
    parent = Path(os.path.abspath(path)).parent
    chains = [parent]
    real = Path(os.path.realpath(parent))
    if real != parent:
        chains.append(real)
    for chain in chains:
        for anc in (*reversed(chain.parents), chain):  # from / down
            why = _ancestor_problem(anc, euid, lstat)
            if why:
                raise UnsafePathError(f"refusing the state directory {path}: {anc} {why}")


def _ancestor_problem(anc: Path, euid: int, lstat: StatFn) -> str:
    """Why ``anc`` may not lie above the state directory ("" when it may)."""
    try:
        st = lstat(str(anc))
    except FileNotFoundError:
        return ""  # to be created by us, mode 0700
    if st.st_uid not in (euid, 0):
        return (
            f"is owned by {owner_name(st.st_uid)}, not by {owner_name(euid)} or root "
            "(another user could replace what lies under it; choose another path)"
        )
    if stat.S_ISLNK(st.st_mode):
        return ""  # root's or ours; where it points is checked on the resolved path
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_mode & _OTHERS_WRITE and not st.st_mode & stat.S_ISVTX:
        return (
            f"is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}) and not "
            "sticky: another user could replace what lies under it"
        )
    return ""


def check_own_dir(path: str | Path, euid: int, lstat: StatFn = os.lstat) -> bool:
    """``path`` is a directory (not a symlink) owned by ``euid`` and writable by nobody
    else; False when it does not exist.

    Raises:
        UnsafePathError: it exists and is not such a directory.
    """
    try:
        st = lstat(str(path))
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "the state directory", "it is a symlink (give the real path)")
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "the state directory", "it is not a directory")
    if st.st_uid != euid:
        raise _not_ours(path, "the state directory", st, euid)
    if st.st_mode & _OTHERS_WRITE:
        raise _refuse(
            path,
            "the state directory",
            f"it is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}): "
            "what lies in it may be another user's (remove it, or chmod 0700 it after "
            "checking its contents)",
        )
    return True


def check_own_file(
    path: str | Path, euid: int, lstat: StatFn = os.lstat, secret: bool = False
) -> bool:
    """``path`` is a regular file (not a symlink) owned by ``euid``: mode exactly 0600
    when ``secret``, else writable by nobody else; False when it does not exist.

    Raises:
        UnsafePathError: it exists and is not such a file (it must not be reused).
    """
    what = "the secret file" if secret else "the file"
    try:
        st = lstat(str(path))
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, what, "it is a symlink, which deepboot never creates there")
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, what, "it is not a regular file")
    if st.st_uid != euid:
        raise _not_ours(path, what, st, euid)
    mode = stat.S_IMODE(st.st_mode)
    if secret and mode != SECRET_MODE:
        raise _refuse(
            path,
            what,
            f"its mode is {mode:04o}, not 0600: it may have been read or written by "
            "another user, so it is never reused (remove it; 'up' makes a fresh one)",
        )
    if not secret and st.st_mode & _OTHERS_WRITE:
        raise _refuse(path, what, f"it is writable by other users (mode {mode:04o})")
    return True


def read_secret(path: str | Path, euid: int | None = None) -> str:
    """The text of secret file ``path``, once :func:`check_own_file` (``secret``) passes;
    opened without following a symlink, and checked again on the open descriptor, so
    a swap between the check and the read is caught.

    Raises:
        FileNotFoundError: no such file.
        UnsafePathError: it is not ours, not 0600, or not a regular file.
    """
    uid = os.geteuid() if euid is None else euid
    if not check_own_file(path, uid, secret=True):
        raise FileNotFoundError(2, "No such file or directory", str(path))
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, encoding="utf-8") as f:
        check_own_file(path, uid, lambda _: os.fstat(f.fileno()), secret=True)
        return f.read()
