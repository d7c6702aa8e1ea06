"""The shell blocks of README.md and docs/*.md that a reader would type, found and
classified for the docs runner (``tests/test_docs_commands.py``, issue 44).

A *command block* is a fenced block (```` ```sh ````, ``bash``, ``shell``,
``console`` or a bare fence) with at least one command whose first word is
``deepboot``, ``.venv/bin/deepboot`` or ``make`` (after any ``NAME=value``
prefixes). Every command block is run, unless the line just above its fence says
otherwise, in an HTML comment a reader of the rendered page does not see:

``<!-- docs-run: skip: REASON -->``
    not run; REASON says why (a Ray cluster, a placeholder, this suite itself...).
``<!-- docs-run: slow -->``
    run by ``make test-slow`` only (the fast suite's blocks stay under 2 minutes in
    all; docs/benchmarks.md records what each took).

Blocks of other commands (``.venv/bin/python bench/...``, ``curl``, ``pip``) are not
command blocks: the benchmarks' own docs say what they take.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^(\s*)```\s*([A-Za-z]*)\s*$")
SHELL_LANGS = frozenset({"", "sh", "bash", "shell", "console"})
DIRECTIVE = re.compile(r"^\s*<!--\s*docs-run:\s*(skip|slow)\s*(?::\s*(.*?))?\s*-->\s*$")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")
COMMANDS = ("deepboot", ".venv/bin/deepboot", "make")


@dataclass(frozen=True, slots=True)
class Block:
    """One command block.

    Attributes:
        path: The Markdown file, relative to the repository root.
        line: The line of its opening fence (1-based).
        text: Its body, as a reader copies it.
        mode: ``run``, ``slow`` or ``skip``.
        reason: Why it is skipped (``skip`` only).
    """

    path: str
    line: int
    text: str
    mode: str
    reason: str = ""

    @property
    def ident(self) -> str:
        """``README.md:39``: where it is, for a test id and a failure."""
        return f"{self.path}:{self.line}"


class DocsError(ValueError):
    """A directive that cannot be read, or a skip without a reason."""


def commands(text: str) -> list[str]:
    """The block's commands: its lines joined at a trailing backslash, comments and
    blank lines dropped, heredoc bodies skipped."""
    out: list[str] = []
    pending = ""
    heredoc: str | None = None
    for raw in text.splitlines():
        if heredoc is not None:
            if raw.strip() == heredoc:
                heredoc = None
            continue
        line = raw.rstrip()
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        out.append(full.strip())
        marker = re.search(r"<<-?\s*'?\"?([A-Za-z_]+)'?\"?", full)
        if marker:
            heredoc = marker.group(1)
    if pending:
        out.append(pending.strip())
    return out


def first_word(command: str) -> str:
    """The program a command runs: its first word after ``NAME=value`` prefixes."""
    for word in command.split():
        if not ASSIGNMENT.match(word):
            return word
    return ""


def is_command_block(text: str) -> bool:
    """Whether a reader would type it as deepboot's (see the module doc)."""
    return any(first_word(c) in COMMANDS for c in commands(text))


def blocks_of(path: Path, root: Path) -> list[Block]:
    """The command blocks of one Markdown file, in order.

    Raises:
        DocsError: a ``docs-run`` comment that is neither form, or a skip with no
            reason; the message names the file and line.
    """
    rel = str(path.relative_to(root))
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            if "docs-run" in lines[i] and not DIRECTIVE.match(lines[i]):
                raise DocsError(f"{rel}:{i + 1}: unreadable docs-run comment: {lines[i]!r}")
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not FENCE.match(lines[i]):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        text = "\n".join(body) + "\n"
        if opening.group(2).lower() not in SHELL_LANGS or not is_command_block(text):
            continue
        above = lines[start - 1] if start > 0 else ""
        directive = DIRECTIVE.match(above)
        if directive is None:
            found.append(Block(rel, start + 1, text, "run"))
            continue
        mode, reason = directive.group(1), (directive.group(2) or "").strip()
        if mode == "skip" and not reason:
            raise DocsError(f"{rel}:{start}: a docs-run skip needs its reason")
        found.append(Block(rel, start + 1, text, mode, reason))
    return found


def doc_files(root: Path) -> list[Path]:
    """README.md and every ``docs/*.md``, in that order."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def all_blocks(root: Path) -> list[Block]:
    """Every command block of :func:`doc_files`."""
    return [b for path in doc_files(root) for b in blocks_of(path, root)]
