"""The runtime's state directory: everything the runtime writes, in one place.

Layout (created on first use, owner-only, mode 0700)::

    <root>/
      cluster.json        what `deepboot up` started or attached to (see raycluster)
      ray-token           Ray's authentication token (mode 0600)
      deepboot.db         the job store (SQLite, WAL; see store)
      controller.pid      the running controller's pid
      controller.lock     held (flock) by the running controller for its whole life:
                          one controller per state directory (see statelock)
      up.lock             held by 'deepboot up' while it starts the cluster
      recording/          what the control loop saw and decided, step by step
                          (bounded chunks; 'deepboot replay' reads them)
      http.json           the running controller's HTTP endpoint: its URL and instance
                          id (see router and endpoint); 'down' removes it
      http-token          the bearer token of that endpoint (mode 0600)
      http-header         the same as an HTTP header, "Authorization: Bearer <token>"
                          (mode 0600), for ``curl -H @STATE_DIR/http-header``
      logs/controller.log the controller's log
      logs/<job>.log      one job's workers' output
      checkpoints/<job>/  a job's checkpoints (restart resizes, failures)
      rendezvous/<job>/   one file store per worker generation (torch.distributed)

Where it lies: ``--state-dir DIR``, else ``$XDG_STATE_HOME/deepboot/default``
(``~/.local/state/deepboot/default`` without it): outside the working directory, so
that a token never lands in a repository or a shared directory. One exception keeps
clusters started by older versions reachable: a ``./.deepboot`` that holds a
cluster's record (``cluster.json``: its cluster is up) is used, with a warning.

Whose it is (issue 42): every path here must be ours (see
:mod:`deepboot.runtime.store.ownership`). :meth:`StateDir.at` refuses a directory that
another user owns or can write, a symlink, or one under a path another user could
change; a token file, the header or the endpoint record that is not a regular 0600
file of ours is refused, never reused; the database, the cluster record and the log
directory must be ours and writable by nobody else. Tokens are created fresh
(``O_CREAT|O_EXCL``, mode 0600).
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from deepboot.runtime.store.ownership import (
    UnsafePathError,
    check_ancestors,
    check_own_dir,
    check_own_file,
    read_secret,
)

log = logging.getLogger("deepboot")

LEGACY_STATE_DIR = Path(".deepboot")
"""Where the state lived by default before issue 42 (relative to the working
directory): still used, with a warning, while it holds a running cluster's record."""

DEFAULT_NAME = "default"
"""The default state directory's name under ``$XDG_STATE_HOME/deepboot``."""

GIT_TIMEOUT_S = 10.0
"""Most seconds ``git check-ignore`` may take (:func:`check_not_committable`)."""


def default_root(
    env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> tuple[Path, bool]:
    """(the state directory to use when none is given, whether it is the legacy
    ``./.deepboot``): that one while it holds a cluster record (its cluster is up),
    else :func:`xdg_root`."""
    legacy = (cwd or Path.cwd()) / LEGACY_STATE_DIR
    if (legacy / "cluster.json").is_file():
        return legacy, True
    return xdg_root(env), False


def xdg_root(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/deepboot/default`` (an absolute ``XDG_STATE_HOME`` only, as the
    XDG spec says), else ``~/.local/state/deepboot/default``."""
    xdg = (os.environ if env is None else env).get("XDG_STATE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "deepboot" / DEFAULT_NAME


#: The ``--state-dir`` help every command that reads or writes a state directory shows.
STATE_DIR_HELP = (
    "the runtime's state directory (cluster record, tokens, job store, logs); default "
    "$XDG_STATE_HOME/deepboot/default, else ~/.local/state/deepboot/default (a "
    "./.deepboot that holds a running cluster is used, with a warning). It must be "
    "yours: a directory another user owns or can write, a symlink, or token files "
    "deepboot did not create are refused"
)


@dataclass(frozen=True, slots=True)
class StateDir:
    """Paths under one state directory. Creating the object touches nothing."""

    root: Path

    @classmethod
    def at(cls, root: str | os.PathLike[str] | None = None) -> StateDir:
        """The state directory ``root`` (None: :func:`default_root`), checked
        (:meth:`verify`); creates nothing. Symlinks are not resolved: a symlinked
        state directory is refused, not followed.

        Raises:
            UnsafePathError: it, or a path it lies under, is not safely ours (one line
                naming the path and its owner).
        """
        if root is None:
            found, legacy = default_root()
            if legacy:
                log.warning(
                    "using the state of the cluster running in ./%s (%s); the default "
                    "state directory is now %s: pass --state-dir to choose",
                    LEGACY_STATE_DIR,
                    found.absolute(),
                    xdg_root(),
                )
            root = found
        return cls(Path(os.path.abspath(root))).verify()

    _DIRS = ("logs", "checkpoints", "rendezvous", "recording")
    _SECRETS = ("ray-token", "http-token", "http-header", "http.json")
    _FILES = ("deepboot.db", "deepboot.db-wal", "deepboot.db-shm", "cluster.json",
              "controller.json", "controller.pid")  # fmt: skip

    def verify(self) -> StateDir:
        """Check, changing nothing, that the directory (if it exists) and what we keep
        in it are ours (see the module doc); returns self.

        Raises:
            UnsafePathError: naming the first path that is not, and why.
        """
        euid = os.geteuid()
        check_ancestors(self.root, euid)
        if not check_own_dir(self.root, euid):
            return self
        for name in self._DIRS:
            check_own_dir(self.root / name, euid)
        for name in self._SECRETS:
            check_own_file(self.root / name, euid, secret=True)
        for name in self._FILES:
            check_own_file(self.root / name, euid)
        return self

    def ensure(self) -> StateDir:
        """Create the directory tree (mode 0700) where missing, after :meth:`verify`;
        returns self. A directory made by someone else between the check and the
        creation is caught (``mkdir`` fails, and the check runs again).

        Raises:
            UnsafePathError: as :meth:`verify`.
        """
        self.verify()
        euid = os.geteuid()
        missing = [p for p in (self.root, *self.root.parents) if not os.path.lexists(p)]
        for d in reversed(missing):  # the ancestors we create are ours, 0700
            _mkdir_private(d)
        check_own_dir(self.root, euid)
        os.chmod(self.root, 0o700)
        for name in self._DIRS[:3]:  # recording/ is made by its writer
            d = self.root / name
            if not check_own_dir(d, euid):
                _mkdir_private(d)
                check_own_dir(d, euid)
        return self

    @property
    def cluster_file(self) -> Path:
        return self.root / "cluster.json"

    @property
    def token_file(self) -> Path:
        return self.root / "ray-token"

    @property
    def http_file(self) -> Path:
        """``{"url", "instance", ...}`` of the running controller's HTTP endpoint (see
        :mod:`deepboot.runtime.client.endpoint`)."""
        return self.root / "http.json"

    @property
    def http_token(self) -> Path:
        return self.root / "http-token"

    @property
    def http_header(self) -> Path:
        return self.root / "http-header"

    @property
    def db(self) -> Path:
        return self.root / "deepboot.db"

    @property
    def controller_pid(self) -> Path:
        return self.root / "controller.pid"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def rendezvous(self) -> Path:
        return self.root / "rendezvous"

    def job_log(self, job: str) -> Path:
        return self.logs / f"{job}.log"

    def job_checkpoint(self, job: str) -> Path:
        return self.checkpoints / job / "latest.pt"

    @property
    def controller_lock(self) -> Path:
        return self.root / "controller.lock"

    @property
    def up_lock(self) -> Path:
        return self.root / "up.lock"

    @property
    def recording(self) -> Path:
        return self.root / "recording"

    def write_controller_pid(self, pid: int) -> None:
        """Record the controller's pid, atomically (others read the file meanwhile)."""
        tmp = self.controller_pid.with_suffix(".tmp")
        tmp.write_text(str(pid))
        os.replace(tmp, self.controller_pid)

    def ensure_token(self) -> Path:
        """The Ray token file: created fresh (256 random bits, mode 0600) if missing;
        an existing one is used only if it is a 0600 regular file of ours.

        Raises:
            UnsafePathError: it exists and is not (it is never reused then).
        """
        return self._secret(self.token_file)

    def ensure_http_token(self) -> Path:
        """The HTTP bearer token file, as :meth:`ensure_token`; also (re)writes
        :attr:`http_header` from it (a fresh file, mode 0600, swapped in atomically).

        Raises:
            UnsafePathError: the token or the header file exists and is not a 0600
                regular file of ours.
        """
        path = self._secret(self.http_token)
        header = f"Authorization: Bearer {self.read_http_token()}\n"
        try:
            current = read_secret(self.http_header)
        except FileNotFoundError:
            current = None
        if current != header:
            self._write_private(self.http_header, header)
        return path

    def read_http_token(self) -> str:
        """The HTTP bearer token (surrounding whitespace removed), read only from a 0600
        regular file of ours.

        Raises:
            FileNotFoundError: there is none.
            UnsafePathError: the file is not ours, not 0600, or not a regular file.
        """
        return read_secret(self.http_token).strip()

    def _write_private(self, path: Path, text: str) -> None:
        """Write ``path`` atomically, mode 0600 from the start."""
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                os.fchmod(f.fileno(), 0o600)  # whatever the umask
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _secret(self, path: Path) -> Path:
        """``path``, a 0600 regular file of ours holding a token: the existing one
        (recovery after a crash: the same token), or a new one created exclusively."""
        self.ensure()
        if check_own_file(path, os.geteuid(), secret=True):
            return path
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)  # whatever the umask
            f.write(secrets.token_hex(32))
        return path


def _mkdir_private(d: Path) -> None:
    """``mkdir d`` with mode 0700 (whatever the umask); an existing entry is left for
    the caller's check to judge."""
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        return
    os.chmod(d, 0o700)


def check_not_committable(path: Path, timeout: float = GIT_TIMEOUT_S) -> None:
    """Refuse to keep secrets at ``path`` when it lies inside a git work tree and git
    does not ignore it (a ``git add .`` would commit the tokens). Outside any work tree
    (no ``.git`` above it) nothing is run.

    Raises:
        UnsafePathError: inside a work tree, at a path git does not ignore; or git
            cannot answer (not installed, the tree is another user's, no answer within
            ``timeout``): then nobody can tell, and the state goes elsewhere.
    """
    top = next((d for d in (path, *path.parents) if os.path.lexists(d / ".git")), None)
    if top is None:
        return
    probe = path / "http-token"
    fix = (
        f"add '{os.path.relpath(path, top)}/' to {top / '.gitignore'}, or pass "
        "--state-dir outside the tree"
    )
    try:
        proc = subprocess.run(
            ["git", "-C", str(top), "check-ignore", "-q", "--", str(probe)],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UnsafePathError(
            f"refusing to write tokens in {path}: it lies in the git work tree {top}, "
            f"and git could not tell whether it ignores it ({exc}); {fix}"
        ) from None
    if proc.returncode == 0:
        return
    if proc.returncode == 1:
        raise UnsafePathError(
            f"refusing to write tokens in {path}: it lies in the git work tree {top} at a "
            f"path git does not ignore ('git add' would commit them); {fix}"
        )
    why = " ".join(proc.stderr.split()) or f"exit {proc.returncode}"
    raise UnsafePathError(
        f"refusing to write tokens in {path}: it lies in the git work tree {top}, and "
        f"git could not tell whether it ignores it ({why}); {fix}"
    )
