"""Every example in README.md runs as written, in order, in a fresh directory.

Each ```python block runs as its own script (an example must not lean on another's
variables) and each ```sh block in bash, both in one scratch directory, so later
examples see the files earlier ones made (cryptdisk.toml, sales.db, ...). A block
preceded by ``<!-- readme-test: skip (reason) -->`` is not run: the install
commands and a server that runs until stopped. The ``cryptdisk`` command and the
package are the ones being tested (this source tree first on PYTHONPATH).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
README = ROOT / "README.md"

_FENCE = re.compile(r"^```(\w*)\s*$")
_SKIP = re.compile(r"^<!--\s*readme-test:\s*skip\b(.*?)-->\s*$")


@dataclass
class Block:
    language: str
    code: str
    line: int
    skip: str | None  # the reason, for blocks marked not to run


def readme_blocks(text: str) -> list[Block]:
    """The fenced code blocks of ``text``, with their skip markers."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i, pending_skip = 0, None
    while i < len(lines):
        marker = _SKIP.match(lines[i])
        fence = _FENCE.match(lines[i])
        if marker:
            pending_skip = marker.group(1).strip(" ()") or "marked skip"
        elif fence:
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append(Block(fence.group(1), "\n".join(body) + "\n", start, pending_skip))
            pending_skip = None
        elif lines[i].strip():
            pending_skip = None  # a marker applies to the block right after it
        i += 1
    return blocks


def test_the_block_parser_sees_markers_and_languages():
    text = ("x\n<!-- readme-test: skip (installs) -->\n```sh\npip install .\n```\n\n"
            "```python\nprint(1)\n```\n<!-- readme-test: skip -->\ntext\n```sh\nls\n```\n")
    blocks = readme_blocks(text)
    assert [(b.language, b.code, b.skip) for b in blocks] == [
        ("sh", "pip install .\n", "installs"), ("python", "print(1)\n", None),
        ("sh", "ls\n", None)]


def test_every_readme_example_runs_in_order(tmp_path):
    blocks = readme_blocks(README.read_text())
    runnable = [b for b in blocks if b.language in ("python", "sh") and b.skip is None]
    skipped = [b for b in blocks if b.skip is not None]
    assert len(runnable) >= 8, "the README lost its examples, or the parser its way"
    assert len(skipped) <= 4, [(b.line, b.skip) for b in skipped]  # keep those few
    assert not [b for b in blocks if b.language not in ("python", "sh", "sql", "")]
    assert shutil.which("cryptdisk"), "the cryptdisk command is not installed"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CRYPTDISK_") and k != "PYTHONWARNINGS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH"))
                                        if p)
    env["HOME"] = str(tmp_path / "home")
    work = tmp_path / "work"
    work.mkdir()
    for block in runnable:
        if block.language == "python":
            argv = [sys.executable, "-c", block.code]
        else:
            argv = ["bash", "-e", "-c", block.code]  # a user's shell: no pipefail (| head)
        done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, (
            f"README.md line {block.line} ({block.language}) failed with "
            f"{done.returncode}:\n{block.code}\n--- stdout\n{done.stdout}\n--- stderr\n"
            f"{done.stderr}")
        assert "Traceback" not in done.stderr, (block.line, done.stderr)
        # an example prints what its comment says it shows, not an object's address
        assert not re.search(r"<[\w.]+ object at 0x[0-9a-f]+>", done.stdout), (
            block.line, done.stdout)


@pytest.mark.parametrize("name", ["cryptdisk.toml", "sales.db", "app.db"])
def test_the_readme_makes_what_its_examples_use(name):
    """Files the examples read are made by an earlier example, not assumed."""
    blocks = [b for b in readme_blocks(README.read_text()) if b.skip is None]
    first_use = next(i for i, b in enumerate(blocks) if name in b.code)
    maker = blocks[first_use].code
    made_here = {"cryptdisk.toml": "cat > cryptdisk.toml", "sales.db": "connect(\"sales.db\")",
                 "app.db": "sqlite.connect(\"app.db\""}[name]
    assert made_here in maker, f"{name} is first used at README line {blocks[first_use].line}"
