"""The README's examples run as written in a fresh copy of the repository and do what it says.

The convention, for whoever edits README.md:

- Every fenced block marked ``sh``, ``console`` or ``python`` is an example, and runs here. Other
  fences (a bare one for a synopsis, ``toml``, ``diff``) are not run.
- A block that cannot run here (it needs a real agent, an API key, npm, or a placeholder such as
  ``RUN`` or a file the reader brings) has this line right before its fence::

      <!-- readme-test: skip (needs claude) -->

  The reason in parentheses is required. An unmarked block that fails fails this test.
- Every ``python`` block, skipped or not, is also type-checked: all of them, each as a module of
  its own, go through one ``mypy --strict`` run, which must be clean (checking needs no agent).
  A block that is no complete module (a fragment such as a top-level ``async with``) has this
  line before its fence, next to any ``readme-test`` marker::

      <!-- readme-typecheck: skip (a fragment of a trio function) -->

  Use it sparingly: a reader copies these blocks into typed code.
- The examples run in README order, in one copy of the working tree (tracked and new files),
  as a reader who followed the quick start would: this Python environment's ``bin`` on PATH (so
  ``orchestrator`` resolves) and as ``.venv`` in the copy, a private HOME and state directory,
  and ``my-project``, a copy of ``examples/sample-project``, for the examples that name it.
- Nothing here reaches a package registry, a model or the machine's installed agents: the
  programs in :data:`REFUSED` are stand-ins that fail (mark such a block skip), and API key
  variables are unset.
- ``sh`` blocks run under ``bash -euo pipefail``; ``console`` blocks run their ``$ `` lines (with
  ``\\`` continuations); ``python`` blocks run as a script. Each must exit 0, and the blocks
  named in :data:`EXPECTED` must print what the README says they do. A block that does not
  apply (no ``apply`` in its text) must leave the sample projects as they were.
- ``./dev`` sets up a venv with pip, so in the copy it is a stand-in: ``./dev demo`` runs
  ``python examples/demo.py`` (what ``./dev`` runs once ``.venv`` is set up) and ``./dev test``
  only says it is this suite; ``tests/test_dev_setup.py`` tests ``./dev`` itself.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from attrs import frozen

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
VENV = Path(sys.executable).parent.parent
LANGUAGES = ("sh", "console", "python")
MARKER = "readme-test"  # skips running a block
TYPECHECK_MARKER = "readme-typecheck"  # skips type-checking a python block
SKIP = re.compile(r"skip \((.+)\)")

#: (language, text in the block) -> what its output must contain; each names one runnable block
EXPECTED: dict[tuple[str, str], tuple[str, ...]] = {
    ("sh", "./dev demo"): ("settled by merge='ours'", "== report:", "the project is untouched"),
    ("sh", "orchestrator runs --limit 1"): ("pipeline succeeded",),
    ("sh", 'replace "colour" with "color" in **/*.md'): ("README.md",),
    ("sh", "rename badge_colour to badge_color in shop/*.py"): ("shop/cart.py", "CHANGES.md"),
    ("python", "from orchestrator import prompt_sync\n"): ("end_turn",),
    ("console", "orchestrator agents --check demo"): (
        "demo: ok\n",
        "  prompt        image no, audio no, embedded context yes\n",
        "  session/new   ok\n",
        "checked 1: 1 ok\n",
    ),
}

#: programs a README example must not run here (they install, download, or start a real agent)
REFUSED = (
    "npm", "npx", "pip", "pip3", "pipx", "uv", "curl", "wget", "pytest",
    "claude", "claude-agent-acp", "claude-code-acp", "codex", "codex-acp", "gemini", "qwen",
    "opencode",
)  # fmt: skip
REFUSED_STAND_IN = """#!/bin/sh
echo "README test: $(basename "$0") is not run here; mark the block readme-test: skip" >&2
exit 97
"""

DEV_STAND_IN = """#!/bin/sh
# stand-in for ./dev in the README test (see tests/test_readme_examples.py)
case "$1" in
    demo) shift; exec python examples/demo.py "$@" ;;
    test) echo "./dev test: the test suite (not run from the README test)" ;;
    *) echo "./dev $1: not run from the README test" >&2; exit 2 ;;
esac
"""


@frozen
class Block:
    """One fenced example of the README."""

    line: int
    language: str
    text: str
    #: the skip reason, or None for a block that runs
    skip: str | None
    #: why a python block is not type-checked, or None for one that is
    typecheck_skip: str | None = None

    @property
    def id(self) -> str:
        """The test id: line and language."""
        return f"README.md:{self.line}:{self.language}"


def _marker_reason(name: str, line: str, lineno: int) -> str | None:
    """The reason of the skip marker ``name`` on ``line``, None when it has none."""
    marker = re.search(rf"<!--\s*{name}:\s*(.*?)\s*-->", line)
    if marker is None:
        return None
    reason = SKIP.fullmatch(marker.group(1))
    if reason is None:
        raise ValueError(f"README.md:{lineno}: not `{name}: skip (REASON)`")
    return reason.group(1)


def readme_blocks(text: str) -> list[Block]:
    """Every ``sh``, ``console`` and ``python`` block, with the markers on the lines before it."""
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(`{3,})(\w*)\s*$", lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(fence.group(1)))
        if fence.group(2) in LANGUAGES:
            skip = typecheck_skip = None
            j = i - 1  # the markers: the comment lines right before the fence
            while j >= 0 and lines[j].startswith("<!--"):
                skip = skip or _marker_reason(MARKER, lines[j], j + 1)
                typecheck_skip = typecheck_skip or _marker_reason(TYPECHECK_MARKER, lines[j], j + 1)
                j -= 1
            body = "\n".join(lines[i + 1 : end]) + "\n"
            blocks.append(Block(i + 1, fence.group(2), body, skip, typecheck_skip))
        i = end + 1
    return blocks


BLOCKS = readme_blocks(README.read_text("utf-8"))
RUNNABLE = [b for b in BLOCKS if b.skip is None]
TYPECHECKED = [b for b in BLOCKS if b.language == "python" and b.typecheck_skip is None]


def console_commands(text: str) -> str:
    """The commands of a ``console`` block: its ``$ `` lines and their continuations."""
    out: list[str] = []
    going = False
    for line in text.splitlines():
        if line.startswith("$ "):
            out.append(line[2:])
        elif going:
            out.append(line)
        else:
            continue
        going = line.endswith("\\")
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh copy of the working tree, set up as the quick start leaves it."""
    root = tmp_path_factory.mktemp("readme") / "acp-orchestrator"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in filter(None, listed):
        source = ROOT / os.fsdecode(raw)
        if not source.is_file() and not source.is_symlink():
            continue  # deleted in the working tree
        target = root / os.fsdecode(raw)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    (root / "dev").write_text(DEV_STAND_IN)
    (root / ".venv").symlink_to(VENV, target_is_directory=True)
    shutil.copytree(root / "examples" / "sample-project", root / "my-project")
    for name in ("home", "state", "refused"):
        (root.parent / name).mkdir()
    for name in REFUSED:
        stand_in = root.parent / "refused" / name
        stand_in.write_text(REFUSED_STAND_IN)
        stand_in.chmod(0o755)
    return root


def environment(copy: Path, *, path: str | None = None) -> dict[str, str]:
    """The reader's environment: ``orchestrator`` on PATH, a private HOME and state."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ORCHESTRATOR_", "VIRTUAL_ENV", "XDG_", "CI"))
        and not k.endswith(("_API_KEY", "_TOKEN"))
    }
    refused = copy.parent / "refused"
    env.update(
        PATH=path if path is not None else f"{refused}:{VENV / 'bin'}:{os.environ['PATH']}",
        HOME=str(copy.parent / "home"),
        ORCHESTRATOR_STATE_DIR=str(copy.parent / "state"),
        PYTHONPATH=str(copy),  # the copy's package, not the one the venv was installed from
        NO_COLOR="1",
    )
    return env


def projects_digest(copy: Path) -> str:
    """A digest of the sample projects' files (``examples/sample-project``, ``my-project``)."""
    h = hashlib.sha256()
    for top in (copy / "examples" / "sample-project", copy / "my-project"):
        for path in sorted(p for p in top.rglob("*") if p.is_file()):
            if "__pycache__" not in path.parts:
                h.update(str(path.relative_to(copy)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def run_block(block: Block, copy: Path) -> subprocess.CompletedProcess[str]:
    """Run one block in the copy."""
    if block.language == "python":
        argv = [sys.executable, "-c", block.text]
    else:
        script = console_commands(block.text) if block.language == "console" else block.text
        argv = ["bash", "-euo", "pipefail", "-c", script]
    return subprocess.run(
        argv,
        cwd=copy,
        env=environment(copy),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_readme_has_runnable_examples_and_every_skip_says_why() -> None:
    """Some examples run; every expectation names one of them; a skip gives its reason."""
    assert RUNNABLE, "no README example is runnable"
    assert all(b.skip for b in BLOCKS if b not in RUNNABLE)
    for language, needle in EXPECTED:
        found = [b.id for b in RUNNABLE if b.language == language and needle in b.text]
        assert len(found) == 1, f"{needle!r} is in the runnable blocks {found}, not in one"


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_readme_example_runs_as_written(block: Block, copy: Path) -> None:
    """The block exits 0 in the fresh copy, prints what the README says, and touches the
    projects only if it applies."""
    before = projects_digest(copy)
    done = run_block(block, copy)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{block.id} exited {done.returncode}:\n{block.text}\n{output}"
    if "apply" not in block.text:
        assert projects_digest(copy) == before, f"{block.id} changed a project without applying"
    for (language, needle), wanted in EXPECTED.items():
        if block.language == language and needle in block.text:
            for text in wanted:
                assert text in output, f"{block.id}: {text!r} not in its output:\n{output}"


def test_the_demo_names_a_runnable_orchestrator_when_it_is_not_on_path(copy: Path) -> None:
    """Run by ``.venv/bin/python`` with the venv not active, the demo's last lines say how to
    run ``orchestrator`` and the demo: by their paths, or after activating the venv."""
    done = subprocess.run(
        [".venv/bin/python", "examples/demo.py"],
        cwd=copy,
        env=environment(copy, path="/usr/bin:/bin"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    last = done.stdout.splitlines()[-3:]
    assert re.fullmatch(
        r"the project is untouched; apply the changes with: "
        r"\.venv/bin/orchestrator apply [0-9a-f]+",
        last[0],
    ), last
    assert last[1] == (
        "or run the demo on a copy of the project and write its changes there: "
        ".venv/bin/python examples/demo.py --project COPY --apply"
    )
    assert "`. .venv/bin/activate`" in last[2]
    assert "pipx install ." in last[2]


def test_readme_python_examples_pass_mypy_strict(tmp_path: Path) -> None:
    """Every python block not marked ``readme-typecheck: skip``, run or not, passes
    ``mypy --strict`` against this tree's package (one mypy run for them all)."""
    assert TYPECHECKED, "no README python block is type-checked"
    files = {}
    for block in TYPECHECKED:
        path = tmp_path / f"readme_line_{block.line}.py"
        path.write_text(block.text)
        files[path.name] = block
    (tmp_path / "mypy.ini").write_text("[mypy]\nstrict = True\npython_version = 3.11\n")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--cache-dir",
         str(ROOT / ".mypy_cache"), *files],
        cwd=tmp_path,
        # this tree's package, not the one the venv was installed from
        env={**os.environ, "MYPYPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    report = done.stdout + done.stderr
    for name, block in files.items():  # name the README's lines, not the temporary files
        report = report.replace(name, f"{block.id} (+{block.text.count(chr(10))} lines)")
    assert done.returncode == 0, report


def test_the_examples_directory_is_type_checked_by_lint() -> None:
    """``./dev lint`` runs mypy as configured, and that configuration covers ``examples/``."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["mypy"]
    assert config["strict"] is True
    assert "examples" in config["files"]
    assert "\n    .venv/bin/mypy\n" in (ROOT / "dev").read_text("utf-8")


def test_blocks_and_markers_are_read_as_documented() -> None:
    """sh/console/python fences are examples; the marker right before one skips it with its
    reason; a marker without a reason is refused; console blocks keep their ``$`` lines."""
    text = (
        "<!-- readme-test: skip (needs claude) -->\n```sh\na\n```\n\n"
        "```toml\nb = 1\n```\n```python\nc = 1\n```\n"
    )
    assert readme_blocks(text) == [
        Block(2, "sh", "a\n", "needs claude"),
        Block(9, "python", "c = 1\n", None),
    ]
    with pytest.raises(ValueError, match="REASON"):
        readme_blocks("<!-- readme-test: skip -->\n```sh\na\n```\n")
    both = (
        "<!-- readme-test: skip (needs claude) -->\n"
        "<!-- readme-typecheck: skip (a fragment) -->\n```python\nawait x\n```\n"
    )
    assert readme_blocks(both) == [Block(3, "python", "await x\n", "needs claude", "a fragment")]
    with pytest.raises(ValueError, match=r"readme-typecheck: skip \(REASON\)"):
        readme_blocks("<!-- readme-typecheck: skip -->\n```python\na\n```\n")
    assert console_commands("$ one \\\n  two\noutput\n$ three\n") == "one \\\n  two\nthree\n"
