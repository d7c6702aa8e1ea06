"""The docs runner's reading of Markdown (tests/docs_blocks.py): which blocks are
deepboot's commands, and the directives that skip or defer one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_blocks import DocsError, blocks_of, commands, is_command_block

DOC = """\
# t

```sh
deepboot simulate --workload w.csv \\
    --policy guarded
```

<!-- docs-run: skip: needs a cluster -->
```sh
.venv/bin/deepboot up
```

<!-- docs-run: slow -->
```bash
T=x make demo
```

```sh
.venv/bin/python bench/speed.py
curl http://127.0.0.1:8470
```

```python
deepboot.simulate()
```

```sh
cat > f.toml <<'EOF'
deepboot = 1
EOF
```
"""


def test_blocks_are_classified_by_their_commands_and_directives(tmp_path: Path) -> None:
    doc = tmp_path / "README.md"
    doc.write_text(DOC)
    found = blocks_of(doc, tmp_path)
    assert [(b.line, b.mode, b.reason) for b in found] == [
        (3, "run", ""),
        (9, "skip", "needs a cluster"),
        (14, "slow", ""),
    ]
    assert found[0].ident == "README.md:3"


def test_commands_join_continuations_and_skip_comments_and_heredocs() -> None:
    text = "# a comment\nFOO=1 deepboot a \\\n  --b c\ncat <<'EOF'\nmake x\nEOF\nls\n"
    assert commands(text) == ["FOO=1 deepboot a    --b c", "cat <<'EOF'", "ls"]
    assert is_command_block("X=1 make demo\n")
    assert not is_command_block("cat <<EOF\ndeepboot\nEOF\n")


@pytest.mark.parametrize(
    "line", ["<!-- docs-run: skip -->", "<!-- docs-run: later -->", "<!-- docs-run skip: x -->"]
)
def test_a_skip_without_a_reason_or_an_unknown_directive_is_refused(
    tmp_path: Path, line: str
) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(f"{line}\n```sh\ndeepboot policies\n```\n")
    with pytest.raises(DocsError, match="x.md:1"):
        blocks_of(doc, tmp_path)
