"""A directory private to this user (mode 0700, not a link), made and removed safely:
the home of a local Ray cluster's directory, which Ray itself opens to every user.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat

from deepboot.core.errors import DeepbootError

log = logging.getLogger("deepboot.runtime")


def ray_dir_of(temp_dir: str) -> str:
    """Ray's ``--temp-dir`` inside a local cluster's private directory ``temp_dir``.

    Not ``temp_dir`` itself: Ray makes every directory it creates, ``--temp-dir``
    included, mode 0777 (each of its worker processes does it again), so that other
    users may share them. The private directory around it keeps them out.
    """
    return os.path.join(temp_dir, "ray")


def why_not_private(path: str) -> str | None:
    """Why ``path`` is not a directory private to this user (None when it is)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != os.geteuid():
        return f"it belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    if stat.S_IMODE(st.st_mode) != 0o700:
        return f"its mode is {stat.S_IMODE(st.st_mode):04o}, not 0700"
    return None


def make_private_dir(path: str) -> str:
    """Create directory ``path``, mode 0700 whatever the umask; returns ``path``.

    A directory already there is used only if it is this user's, mode 0700 and not
    a link: one that another user created first (or a link in its place) could hold
    or see what Ray puts there.

    Raises:
        DeepbootError: ``path`` exists and is not this user's private directory, or
            cannot be created.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise DeepbootError(f"cannot create directory {path}: {exc.strerror}") from None
    else:
        # The umask may have taken bits away; O_NOFOLLOW: chmod this directory, not
        # whatever a link put in its place would point to.
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
    why = why_not_private(path)
    if why is not None:
        raise DeepbootError(
            f"{path} exists and is not this user's private directory ({why}); refusing "
            "to start Ray in it (another user may have created it)"
        )
    return path


def remove_private_dir(path: str, what: str) -> bool:
    """Remove directory ``path`` (``what`` names it in warnings) and all inside it if
    it is this user's private directory; True if it is gone. One that is not ours is
    left alone, with a warning."""
    try:
        why = why_not_private(path)
    except FileNotFoundError:
        return True
    except OSError as exc:
        log.warning("%s %s: %s; left in place", what, path, exc)
        return False
    if why is not None:
        log.warning("%s %s is not ours (%s): left in place", what, path, why)
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)
