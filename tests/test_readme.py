"""Every example in README.md and docs/*.md runs as written, in order.

Each ```python block runs as its own script (an example must not lean on another's
variables) and each ```sh block in bash. The README's run in one fresh scratch
directory, so later examples see the files earlier ones made (cryptdisk.toml,
sales.db, ...); each docs page's then run, in order, in a copy of the directory the
README's left, as a reader who followed the README has it. A block preceded by
``<!-- readme-test: skip (reason) -->`` is not run: install commands, a server that
runs until stopped, examples that need a deployment (an S3 bucket, a Dask cluster, an
HSM or a KMS) or that another test runs. The ``cryptdisk`` command and the package are
the ones being tested (this source tree first on PYTHONPATH).
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


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CRYPTDISK_") and k != "PYTHONWARNINGS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH"))
                                        if p)
    env["HOME"] = str(home)
    return env


def _run_blocks(name: str, blocks: list[Block], work: Path, env: dict[str, str]) -> None:
    for block in blocks:
        if block.language == "python":
            argv = [sys.executable, "-c", block.code]
        else:
            argv = ["bash", "-e", "-c", block.code]  # a user's shell: no pipefail (| head)
        done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, (
            f"{name} line {block.line} ({block.language}) failed with "
            f"{done.returncode}:\n{block.code}\n--- stdout\n{done.stdout}\n--- stderr\n"
            f"{done.stderr}")
        assert "Traceback" not in done.stderr, (name, block.line, done.stderr)
        # an example prints what its comment says it shows, not an object's address
        assert not re.search(r"<[\w.]+ object at 0x[0-9a-f]+>", done.stdout), (
            name, block.line, done.stdout)


def _runnable(blocks: list[Block]) -> list[Block]:
    return [b for b in blocks if b.language in ("python", "sh") and b.skip is None]


@pytest.fixture(scope="module")
def readme_workspace(tmp_path_factory) -> Path:
    """The directory the README's examples leave, run in order (once per module)."""
    assert shutil.which("cryptdisk"), "the cryptdisk command is not installed"
    base = tmp_path_factory.mktemp("readme")
    work = base / "work"
    work.mkdir()
    _run_blocks("README.md", _runnable(readme_blocks(README.read_text())), work,
                _env(base / "home"))
    return work


def test_every_readme_example_runs_in_order(readme_workspace):
    blocks = readme_blocks(README.read_text())
    runnable = _runnable(blocks)
    skipped = [b for b in blocks if b.skip is not None]
    assert len(runnable) >= 8, "the README lost its examples, or the parser its way"
    assert len(skipped) <= 4, [(b.line, b.skip) for b in skipped]  # keep those few
    assert not [b for b in blocks if b.language not in ("python", "sh", "sql", "")]
    assert (readme_workspace / "sales.db").is_dir() and (readme_workspace / "app.db").is_file()


DOCS = sorted((ROOT / "docs").glob("*.md"))
# languages shown, never run: SQL, configs, program output and layouts
SHOWN = ("sql", "toml", "text", "")


@pytest.mark.parametrize("page", [p.name for p in DOCS
                                  if _runnable(readme_blocks(p.read_text()))])
def test_every_docs_example_runs_in_order(readme_workspace, tmp_path, page):
    blocks = readme_blocks((ROOT / "docs" / page).read_text())
    assert not [(b.line, b.language) for b in blocks
                if b.language not in ("python", "sh", *SHOWN)], "a language this test ignores"
    work = tmp_path / "work"
    shutil.copytree(readme_workspace, work, symlinks=True)
    _run_blocks(f"docs/{page}", _runnable(blocks), work, _env(tmp_path / "home"))


def test_docs_examples_are_run_or_say_why_not():
    """A skipped block says why, and skipping does not grow unnoticed: the examples that
    need a deployment (S3, a Dask cluster, an HSM or KMS, a running server) are counted
    here, and a new example runs unless this count is raised with it."""
    run = skipped = 0
    for page in DOCS:
        for block in readme_blocks(page.read_text()):
            if block.language in ("python", "sh"):
                if block.skip is None:
                    run += 1
                else:
                    assert block.skip != "marked skip", (page.name, block.line)
                    skipped += 1
    assert run >= 9 and skipped <= 18, (run, skipped)


@pytest.mark.parametrize("name", ["cryptdisk.toml", "sales.db", "app.db"])
def test_the_readme_makes_what_its_examples_use(name):
    """Files the examples read are made by an earlier example, not assumed."""
    blocks = [b for b in readme_blocks(README.read_text()) if b.skip is None]
    first_use = next(i for i, b in enumerate(blocks) if name in b.code)
    maker = blocks[first_use].code
    made_here = {"cryptdisk.toml": "cat > cryptdisk.toml", "sales.db": "connect(\"sales.db\")",
                 "app.db": "sqlite.connect(\"app.db\""}[name]
    assert made_here in maker, f"{name} is first used at README line {blocks[first_use].line}"
