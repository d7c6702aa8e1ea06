"""A rich progress bar fed by the simulator's ``on_progress(now, completed, total)``."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def format_sim_time(seconds: float) -> str:
    """``93784.0`` -> ``"1d 02:03:04"``; ``3723.0`` -> ``"01:02:03"``."""
    total = max(int(seconds), 0)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}d {clock}" if days else clock


class SimProgress:
    """Context manager and ``on_progress`` callback: completed jobs and simulated time.

    When ``enabled`` is false (``--quiet``, or stderr is not a terminal) it draws
    nothing and the callback only records the last values.
    """

    def __init__(self, console: Console, total: int, enabled: bool) -> None:
        self.enabled = enabled
        self.now = 0.0
        self.completed = 0
        self._progress = Progress(
            TextColumn("simulating"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("jobs  sim time {task.fields[sim]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
            transient=False,
        )
        self._task = self._progress.add_task("simulate", total=total, sim=format_sim_time(0.0))

    def __call__(self, now: float, completed: int, total: int) -> None:
        self.now = now
        self.completed = completed
        self._progress.update(
            self._task, completed=completed, total=total, sim=format_sim_time(now)
        )

    def __enter__(self) -> SimProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()
