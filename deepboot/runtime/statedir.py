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
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

DEFAULT_STATE_DIR = Path(".deepboot")


@dataclass(frozen=True, slots=True)
class StateDir:
    """Paths under one state directory. Creating the object touches nothing."""

    root: Path

    @classmethod
    def at(cls, root: str | os.PathLike[str] | None = None) -> StateDir:
        return cls(Path(root if root is not None else DEFAULT_STATE_DIR).resolve())

    def ensure(self) -> StateDir:
        """Create the directory tree (mode 0700) if missing; returns self."""
        for d in (self.root, self.logs, self.checkpoints, self.rendezvous):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o700)
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
        :mod:`deepboot.runtime.endpoint`)."""
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
        """The Ray token file, created (256 random bits, mode 0600) if missing."""
        return self._secret(self.token_file)

    def ensure_http_token(self) -> Path:
        """The HTTP bearer token file, created (256 random bits, mode 0600) if missing;
        also (re)writes :attr:`http_header` from it."""
        path = self._secret(self.http_token)
        header = f"Authorization: Bearer {path.read_text().strip()}\n"
        try:
            current = self.http_header.read_text()
        except OSError:
            current = None
        if current != header:
            self._write_private(self.http_header, header)
        os.chmod(self.http_header, 0o600)
        return path

    def _write_private(self, path: Path, text: str) -> None:
        """Write ``path`` atomically, mode 0600 from the start."""
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _secret(self, path: Path) -> Path:
        self.ensure()
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        os.chmod(path, 0o600)
        return path
