"""``orchestrator batch`` through the console script, with the demo agent on local git repositories.

Each repository is a real git repository (``app.txt`` holding ``greeting = old``) whose ``origin``
is a local bare repository; the pipeline has the demo agent replace ``old`` with ``new`` in
``app.txt``, checked by ``test ! -e FAIL``: a repository with a committed ``FAIL`` file fails its
verification until that file is removed. What users hold (working tree, index, HEAD, current
branch) is read before and after, byte for byte.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio
from conftest import is_process_watchdog, pid_gone
from run_helpers import CLI, CLI_LIMIT, as_json, one_line_error, run_cli

from orchestrator.cli.output import output_schema

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]

#: the pipeline every repository runs
PIPELINE = """\
from orchestrator import step


@step(agent="demo", check="test ! -e FAIL")
def fix() -> str:
    return 'replace "old" with "new" in app.txt\\n'
"""
#: a pipeline whose agent turn sleeps in the repositories holding SLOW (for Ctrl-C)
SLOW_PIPELINE = """\
from orchestrator import step


@step(agent="demo")
def fix() -> str:
    return 'replace "old" with "new" in app.txt\\nrun if test -e SLOW; then sleep 30; fi\\n'
"""
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
    "PATH": "/usr/bin:/bin",
}
BRANCH = "agent/fix"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


# --------------------------------------------------------------------------- helpers


def git(repo: Path, *argv: str) -> str:
    """Run git in ``repo``; its stdout, stripped."""
    done = subprocess.run(
        ["git", *argv], cwd=repo, env=GIT_ENV, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def make_repo(
    root: Path, name: str, *, fail: bool = False, dirty: bool = False, remote: bool = True
) -> Path:
    """A repository ``root/name`` with ``app.txt`` committed on ``main`` (and ``FAIL`` when
    ``fail``), pushed to a bare ``origin`` under ``root/remotes``; with ``dirty``, an unstaged
    change to ``notes.txt``, a staged new file and an untracked one."""
    repo = root / name
    repo.mkdir(parents=True)
    (repo / "app.txt").write_text("greeting = old\n")
    (repo / "notes.txt").write_text(f"notes of {name}\n")
    if fail:
        (repo / "FAIL").write_text("not yet\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "start")
    if remote:
        bare = root / "remotes" / f"{name}.git"
        bare.mkdir(parents=True)
        git(bare, "init", "-q", "--bare", "-b", "main")
        git(repo, "remote", "add", "origin", str(bare))
        git(repo, "push", "-q", "origin", "main")
    if dirty:
        (repo / "notes.txt").write_text(f"notes of {name}, edited and not staged\n")
        (repo / "staged.txt").write_text("staged, not committed\n")
        git(repo, "add", "staged.txt")
        (repo / "untracked.txt").write_text("nobody added me\n")
    return repo


def bare(repo: Path) -> Path:
    """The bare repository that is ``repo``'s origin."""
    return repo.parent / "remotes" / f"{repo.name}.git"


def branch_commit(repo: Path, branch: str = BRANCH) -> str | None:
    """The commit of ``branch`` in ``repo`` (bare or not), None when it has no such branch."""
    found = git(repo, "for-each-ref", "--format=%(objectname)", f"refs/heads/{branch}")
    return found or None


def user_state(repo: Path) -> dict[str, Any]:
    """What the user holds in ``repo``: every working-tree file's bytes, the index's bytes,
    HEAD's commit and the current branch (read without any git command that writes)."""
    files = {
        p.relative_to(repo).as_posix(): p.read_bytes()
        for p in sorted(repo.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(repo).parts
    }
    return {
        "files": files,
        "index": (repo / ".git" / "index").read_bytes(),
        "head": git(repo, "rev-parse", "HEAD"),
        "branch": git(repo, "symbolic-ref", "HEAD"),
    }


def branches(repo: Path) -> list[str]:
    """The names of ``repo``'s branches."""
    return git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads").split()


def write_pipeline(tmp_path: Path, text: str = PIPELINE) -> Path:
    """The pipeline file, beside the repositories."""
    path = tmp_path / "fix.py"
    path.write_text(text)
    return path


def write_list(tmp_path: Path, lines: Iterable[str]) -> Path:
    """A repository list file holding ``lines`` (with a comment and a blank line)."""
    path = tmp_path / "repos.txt"
    path.write_text("# the repositories of the batch\n\n" + "".join(f"{x}\n" for x in lines))
    return path


def batch_schema() -> dict[str, Any]:
    """The output schema, narrowed to the batch object (not any of the objects it allows)."""
    schema = output_schema()
    return {**schema, "anyOf": [{"$ref": "#/$defs/batch"}]}


def checked(done: subprocess.CompletedProcess[bytes], code: int) -> dict[str, Any]:
    """A batch's ``--json`` object, exit ``code``, valid under the output schema's batch."""
    assert done.returncode == code, done.stderr.decode()
    assert b"Traceback" not in done.stderr
    document: dict[str, Any] = as_json(done)
    jsonschema.Draft202012Validator(output_schema()).validate(document)
    jsonschema.Draft202012Validator(batch_schema()).validate(document)
    return document


def by_name(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The batch object's repositories, by name."""
    return {r["name"]: r for r in document["repos"]}


async def runs_json(tmp_path: Path, state: Path) -> list[dict[str, Any]]:
    """``runs --json --limit 1000``: every recorded run."""
    done = await run_cli("runs", "--json", "--limit", "1000", cwd=tmp_path, state=state)
    assert done.returncode == 0, done.stderr.decode()
    runs: list[dict[str, Any]] = as_json(done)["runs"]
    return runs


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc/PID/task/*/children)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                kids = [int(k) for k in children.read_text().split()]
            except OSError:
                continue  # the thread or process ended meanwhile
            for kid in kids:
                if kid not in found:
                    found.add(kid)
                    todo.append(kid)
    return found


def command_line(pid: int) -> list[str]:
    """A process's argv ([] once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


# --------------------------------------------------------------------------- the must-show


async def test_twenty_repositories_branches_push_and_resume(
    tmp_path: Path, state_dir: Path
) -> None:
    """20 repositories (3 failing verification, some dirty) and a wrong clone URL: exit 1, a
    branch (and its push) exactly where the run succeeded, the users' trees, indexes, HEADs and
    branches untouched; fixed and resumed, only what failed runs again, keeping its run ids."""
    failing = {"svc-04", "svc-09", "svc-14"}
    names = [f"svc-{i:02}" for i in range(20)]
    repos = {
        n: make_repo(tmp_path, n, fail=n in failing, dirty=i % 3 == 0) for i, n in enumerate(names)
    }
    assert sum((repos[n] / "staged.txt").exists() for n in names) == 7
    missing = (tmp_path / "nowhere" / "svc-gone.git").as_uri()
    listing = write_list(tmp_path, [*(f"./{n}" for n in names), missing])
    pipeline = write_pipeline(tmp_path)
    before = {n: user_state(r) for n, r in repos.items()}

    argv = ["batch", str(pipeline), "--repos", str(listing), "--policy", "edit"]
    argv += ["--git-branch", BRANCH, "--push", "origin", "--json"]
    first = checked(await run_cli(*argv, cwd=tmp_path, state=state_dir), EXIT_FAILED)
    entries = by_name(first)
    assert list(entries) == [*names, "svc-gone"]
    problems = {n: e["error"] for n, e in entries.items() if e["status"] != "succeeded"}
    assert set(problems) == {*failing, "svc-gone"}, problems
    assert first["counts"] == {"succeeded": 17, "failed": 4, "skipped": 0, "interrupted": 0,
                               "pending": 0}  # fmt: skip
    assert first["status"] == "failed" and first["exitCode"] == 1
    for name in names:
        entry, repo = entries[name], repos[name]
        assert entry["path"] == str(repo)
        assert entry["head"] == before[name]["head"]
        if name in failing:
            assert (entry["status"], entry["exitCode"], entry["verify"]) == ("failed", 1, "failed")
            assert entry["branch"] is None and entry["pushed"] is None
            assert branches(repo) == branches(bare(repo)) == ["main"]
        else:
            assert (entry["status"], entry["exitCode"]) == ("succeeded", 0)
            assert entry["verify"] == "passed"
            assert (entry["files"], entry["added"], entry["removed"]) == (1, 1, 1)
            assert (entry["branch"], entry["pushed"]) == (BRANCH, "origin")
            commit = branch_commit(repo)
            assert commit is not None and commit == entry["branchCommit"]
            assert branch_commit(bare(repo)) == commit
            assert branches(repo) == branches(bare(repo)) == [BRANCH, "main"]
            # the branch is HEAD and the pipeline's change, nothing of what the user had staged
            assert git(repo, "rev-parse", f"{commit}^") == before[name]["head"]
            assert git(repo, "diff", "--name-only", "HEAD", commit) == "app.txt"
            assert git(repo, "show", f"{commit}:app.txt") == "greeting = new"
        assert user_state(repo) == before[name], name
    gone = entries["svc-gone"]
    assert (gone["status"], gone["url"], gone["runId"], gone["path"]) == (
        "failed", missing, None, None,
    )  # fmt: skip
    assert "clone" in gone["error"] and "\n" not in gone["error"]

    # `runs` lists the batch with its 20 children (the bad URL never got one)
    listed = await runs_json(tmp_path, state_dir)
    batch_id = first["runId"]
    children = {r["runId"]: r for r in listed if r["parent"] == batch_id}
    assert sorted(children) == sorted(entries[n]["runId"] for n in names)
    assert [r["runId"] for r in listed if r["kind"] == "batch"] == [batch_id]

    # the failing repositories fixed, as their users would: FAIL removed in a commit
    for name in failing:
        git(repos[name], "rm", "-q", "FAIL")
        git(repos[name], "commit", "-qm", "fixed", "--", "FAIL")
    before = {n: user_state(r) for n, r in repos.items()}
    assert all("staged.txt" in before[n]["files"] for n in ("svc-09",))

    resumed = await run_cli("resume", batch_id, "--json", cwd=tmp_path, state=state_dir)
    second = checked(resumed, EXIT_FAILED)
    assert second["runId"] == batch_id
    assert second["counts"] == {"succeeded": 20, "failed": 1, "skipped": 0, "interrupted": 0,
                                "pending": 0}  # fmt: skip
    again = by_name(second)
    assert again["svc-gone"]["status"] == "failed" and again["svc-gone"]["runId"] is None
    relisted = {r["runId"]: r for r in await runs_json(tmp_path, state_dir)}
    assert len(relisted) == len(listed)  # no new run: the failed ones were resumed
    for name in names:
        entry, repo = again[name], repos[name]
        assert entry["runId"] == entries[name]["runId"], name  # the same child run
        assert entry["status"] == "succeeded" and entry["branch"] == BRANCH
        commit = branch_commit(repo)
        assert commit == entry["branchCommit"] and branch_commit(bare(repo)) == commit
        child = relisted[entry["runId"]]
        if name in failing:
            assert child["finished"] > children[entry["runId"]]["finished"]
            assert git(repo, "rev-parse", f"{commit}^") == before[name]["head"]
        else:  # not run again: its record and its branch as the first attempt left them
            assert child == children[entry["runId"]], name
            assert entry == entries[name], name
        assert user_state(repo) == before[name], name


async def test_a_token_budget_stops_the_batch_then_resume_finishes(
    tmp_path: Path, state_dir: Path
) -> None:
    """One repository at a time, a token budget spent during the second: two succeed, the rest
    are skipped (budget), exit 1; resumed with a larger budget, the rest succeed."""
    pipeline = write_pipeline(tmp_path)
    probe = make_repo(tmp_path, "probe", remote=False)
    measured = await run_cli(
        "batch", str(pipeline), "--repo", str(probe), "--policy", "edit", "--json",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    tokens = checked(measured, EXIT_OK)["repos"][0]["tokens"]
    assert isinstance(tokens, int) and tokens > 0

    names = [f"r{i}" for i in range(6)]
    repos = [make_repo(tmp_path, n, remote=False) for n in names]
    listing = write_list(tmp_path, [str(r) for r in repos])
    argv = ["batch", str(pipeline), "--repos", str(listing), "--policy", "edit"]
    argv += ["--git-branch", BRANCH, "--max-repos", "1", "--json"]
    budget = ["--max-tokens", str(tokens + tokens // 2)]
    first = checked(await run_cli(*argv, *budget, cwd=tmp_path, state=state_dir), EXIT_FAILED)
    entries = by_name(first)
    assert [entries[n]["status"] for n in names] == ["succeeded"] * 2 + ["skipped"] * 4
    assert [entries[n]["skipped"] for n in names] == [None] * 2 + ["budget"] * 4
    assert all(entries[n]["runId"] is None for n in names[2:])
    assert first["budget"]["tokens"] == 2 * tokens
    assert first["budget"]["spent"] is not None
    assert first["counts"]["skipped"] == 4
    assert [branch_commit(r) is not None for r in repos] == [True] * 2 + [False] * 4

    resumed = await run_cli(
        "resume", first["runId"], "--max-tokens", str(10 * tokens), "--json",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    second = checked(resumed, EXIT_OK)
    again = by_name(second)
    assert [again[n]["status"] for n in names] == ["succeeded"] * 6
    assert second["budget"]["maxTokens"] == 10 * tokens
    assert second["budget"]["tokens"] == 4 * tokens  # only the four run now count
    assert [again[n]["runId"] for n in names[:2]] == [entries[n]["runId"] for n in names[:2]]
    assert all(branch_commit(r) == again[r.name]["branchCommit"] for r in repos)


# --------------------------------------------------------------------------- bad usage


def usage_cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """Each refused command line, and a word its one line of error says."""
    repo = make_repo(tmp_path, "svc", remote=False)
    pipeline = write_pipeline(tmp_path)
    (tmp_path / "bad.txt").write_text(f"{repo}\n{repo} main extra words\n")
    url = (tmp_path / "remotes" / "x.git").as_uri()
    base = ["batch", str(pipeline)]
    return {
        "no repositories": (base, "repositories"),
        "push without a branch": ([*base, "--repo", str(repo), "--push", "origin"], "--push"),
        "apply with a branch": (
            [*base, "--repo", str(repo), "--apply", "--git-branch", BRANCH],
            "--apply",
        ),
        "unknown message field": (
            [*base, "--repo", str(repo), "--git-branch", BRANCH, "--message", "fix {nope}"],
            "nope",
        ),
        "bad list line": ([*base, "--repos", str(tmp_path / "bad.txt")], "bad.txt"),
        "missing pipeline": (
            ["batch", str(tmp_path / "absent.py"), "--repo", str(repo)],
            "absent.py",
        ),
        "apply with a URL": ([*base, "--repo", str(repo), "--repo", url, "--apply"], "x.git"),
        "formatted message field": (
            [*base, "--repo", str(repo), "--git-branch", BRANCH, "--message", "{batch_id:d}"],
            "formats",
        ),
        "invalid branch name": ([*base, "--repo", str(repo), "--git-branch", "bad..name"], "bad.."),
        "list that is no file": ([*base, "--repos", str(fifo(tmp_path))], "regular file"),
    }


def fifo(tmp_path: Path) -> Path:
    """A named pipe no one writes to (reading it would wait for ever)."""
    path = tmp_path / "repos.fifo"
    if not path.exists():
        os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    "case",
    [
        "no repositories",
        "push without a branch",
        "apply with a branch",
        "unknown message field",
        "bad list line",
        "missing pipeline",
        "apply with a URL",
        "formatted message field",
        "invalid branch name",
        "list that is no file",
    ],
)
async def test_bad_usage_exits_2_with_one_line_and_records_nothing(
    tmp_path: Path, state_dir: Path, case: str
) -> None:
    """Each bad command line: exit 2, one line on stderr naming the problem, no traceback,
    nothing recorded, no repository touched."""
    argv, word = usage_cases(tmp_path)[case]
    repo = tmp_path / "svc"
    before = user_state(repo)
    line = one_line_error(await run_cli(*argv, cwd=tmp_path, state=state_dir))
    assert word in line, line
    assert "Traceback" not in line
    assert await runs_json(tmp_path, state_dir) == []
    assert user_state(repo) == before


async def test_a_bad_reuse_setting_exits_2_before_any_repository_runs(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ORCHESTRATOR_REUSE_DIRS that is neither a yes nor a no: one line, exit 2, no batch
    recorded (not a failed run per repository)."""
    repo = make_repo(tmp_path, "svc", remote=False)
    monkeypatch.setenv("ORCHESTRATOR_REUSE_DIRS", "maybe")
    done = await run_cli(
        "batch", str(write_pipeline(tmp_path)), "--repo", str(repo), cwd=tmp_path, state=state_dir
    )
    assert done.returncode == 2
    assert "ORCHESTRATOR_REUSE_DIRS='maybe'" in one_line_error(done)
    monkeypatch.delenv("ORCHESTRATOR_REUSE_DIRS")
    assert await runs_json(tmp_path, state_dir) == []


async def test_resume_refuses_options_that_do_not_fit_the_run(
    tmp_path: Path, state_dir: Path
) -> None:
    """resume: a batch's budget options on a pipeline run, and a pipeline run's --apply on a
    batch, exit 2 with one line, and neither run is touched."""
    repo = make_repo(tmp_path, "svc", remote=False)
    pipeline = write_pipeline(tmp_path)
    argv = ["batch", str(pipeline), "--repo", str(repo), "--policy", "edit", "--json"]
    document = checked(await run_cli(*argv, cwd=tmp_path, state=state_dir), EXIT_OK)
    batch_id, child = document["runId"], document["repos"][0]["runId"]
    before = await runs_json(tmp_path, state_dir)
    for args, word in (
        ([child, "--max-tokens", "5"], "--max-tokens"),
        ([child, "--max-repos", "2"], "--max-repos"),
        ([batch_id, "--apply"], "--apply"),
    ):
        line = one_line_error(await run_cli("resume", *args, cwd=tmp_path, state=state_dir))
        assert word in line, line
    assert await runs_json(tmp_path, state_dir) == before
    assert user_state(repo)["files"]["app.txt"] == b"greeting = old\n"


# --------------------------------------------------------------------------- what comes out


async def test_apply_writes_local_checkouts_in_place_but_not_failing_ones(
    tmp_path: Path, state_dir: Path
) -> None:
    """--apply: each succeeded repository's app.txt changed in place (nothing else, no commit,
    no branch); the failing one left as it was; exit 1."""
    ok = [make_repo(tmp_path, n, remote=False, dirty=n == "a") for n in ("a", "b")]
    bad = make_repo(tmp_path, "c", fail=True, remote=False)
    pipeline = write_pipeline(tmp_path)
    before = {r.name: user_state(r) for r in (*ok, bad)}
    argv = ["batch", str(pipeline), "--policy", "edit", "--apply", "--json"]
    for repo in (*ok, bad):
        argv += ["--repo", str(repo)]
    document = checked(await run_cli(*argv, cwd=tmp_path, state=state_dir), EXIT_FAILED)
    entries = by_name(document)
    assert [(entries[n]["status"], entries[n]["applied"]) for n in "abc"] == [
        ("succeeded", True), ("succeeded", True), ("failed", False),
    ]  # fmt: skip
    for repo in ok:
        now = user_state(repo)
        expected = dict(before[repo.name]["files"], **{"app.txt": b"greeting = new\n"})
        assert now["files"] == expected
        assert now["head"] == before[repo.name]["head"]
        assert now["branch"] == before[repo.name]["branch"]
        assert branches(repo) == ["main"]
    assert user_state(bad) == before["c"]


async def test_url_repositories_are_cloned_and_their_branch_pushed(
    tmp_path: Path, state_dir: Path
) -> None:
    """file:// URLs of bare repositories (one with a ref): cloned into the state directory's
    cache, never into the user's checkouts; --git-branch with --push origin reaches each."""
    sources = [make_repo(tmp_path, n) for n in ("u1", "u2")]
    git(sources[1], "checkout", "-q", "-b", "release")
    (sources[1] / "app.txt").write_text("greeting = old\nrelease = yes\n")
    git(sources[1], "commit", "-qam", "release")
    git(sources[1], "push", "-q", "origin", "release")
    before = {r.name: user_state(r) for r in sources}
    urls = [bare(r).as_uri() for r in sources]
    listing = write_list(tmp_path, [urls[0], f"{urls[1]} release"])
    pipeline = write_pipeline(tmp_path)
    argv = ["batch", str(pipeline), "--repos", str(listing), "--policy", "edit"]
    argv += ["--git-branch", BRANCH, "--push", "origin", "--json"]
    document = checked(await run_cli(*argv, cwd=tmp_path, state=state_dir), EXIT_OK)
    entries = by_name(document)
    assert [entries[n]["url"] for n in ("u1", "u2")] == urls
    assert entries["u2"]["ref"] == "release"
    for name, repo, parent in (
        ("u1", sources[0], git(sources[0], "rev-parse", "main")),
        ("u2", sources[1], git(sources[1], "rev-parse", "release")),
    ):
        entry = entries[name]
        assert entry["status"] == "succeeded" and entry["pushed"] == "origin"
        assert Path(entry["path"]).is_relative_to(state_dir)
        assert entry["head"] == parent
        commit = branch_commit(bare(repo))
        assert commit is not None and commit == entry["branchCommit"]
        assert git(bare(repo), "rev-parse", f"{commit}^") == parent
        assert user_state(repo) == before[name]  # the user's own checkout is not the clone
    # a clone of the cache is no place to apply to: the next batch resets it
    done = await run_cli("apply", entries["u1"]["runId"], cwd=tmp_path, state=state_dir)
    assert done.returncode == 2 and "commit its changes on a git branch" in one_line_error(done)
    assert not git(Path(entries["u1"]["path"]), "status", "--porcelain")


async def test_report_names_every_repository(tmp_path: Path, state_dir: Path) -> None:
    """--report DIR: report.html and report.md, each naming every repository of the batch."""
    repos = [make_repo(tmp_path, n, remote=False, fail=n == "beta") for n in ("alpha", "beta")]
    pipeline = write_pipeline(tmp_path)
    report = tmp_path / "report"
    argv = ["batch", str(pipeline), "--policy", "edit", "--json", "--report", str(report)]
    for repo in repos:
        argv += ["--repo", str(repo)]
    document = checked(await run_cli(*argv, cwd=tmp_path, state=state_dir), EXIT_FAILED)
    assert document["report"] == {
        "html": str(report / "report.html"),
        "markdown": str(report / "report.md"),
    }
    for name in ("report.html", "report.md"):
        text = (report / name).read_text()
        assert "alpha" in text and "beta" in text, name
        assert "greeting = new" in text, name  # alpha's diff


async def test_runs_lists_the_batch_with_its_children(tmp_path: Path, state_dir: Path) -> None:
    """runs: the batch's line, then one indented line per repository's child run (oldest
    first: one repository at a time, in the batch's order), naming its repository."""
    repos = [make_repo(tmp_path, n, remote=False) for n in ("one", "two", "three")]
    pipeline = write_pipeline(tmp_path)
    argv = ["batch", str(pipeline), "--policy", "edit", "--json", "--max-repos", "1"]
    for repo in repos:
        argv += ["--repo", str(repo)]
    document = checked(await run_cli(*argv, cwd=tmp_path, state=state_dir), EXIT_OK)
    kids = [r["runId"] for r in document["repos"]]
    listed = await runs_json(tmp_path, state_dir)
    assert [(r["runId"], r["kind"], r["parent"]) for r in listed] == [
        (document["runId"], "batch", None),
        *((kid, "pipeline", document["runId"]) for kid in kids),
    ]
    done = await run_cli("runs", cwd=tmp_path, state=state_dir)
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 4 and lines[0].split()[0] == document["runId"]
    assert [line.split()[:2] for line in lines[1:]] == [["\u21b3", kid] for kid in kids]
    assert [line.split()[-1] for line in lines[1:]] == ["one", "two", "three"]


# --------------------------------------------------------------------------- Ctrl-C


async def interrupt_when(
    argv: Sequence[str], *, cwd: Path, state: Path, out: Path, ready: str
) -> tuple[int, set[int], str, str]:
    """Start the console script; once a descendant's argv is ``ready`` (split on spaces),
    SIGINT; its exit code, its descendants just before the signal, stdout and stderr."""
    stdout_path, stderr_path = out / "stdout.txt", out / "stderr.txt"
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state)}
    with (
        trio.fail_after(CLI_LIMIT),
        stdout_path.open("wb") as stdout,
        stderr_path.open("wb") as stderr,
    ):
        cli = await trio.lowlevel.open_process(
            [str(CLI), *argv], cwd=cwd, env=env, stdout=stdout, stderr=stderr
        )
        try:
            while not any(command_line(p) == ready.split() for p in descendants(cli.pid)):
                assert cli.poll() is None, stderr_path.read_text()
                await trio.sleep(0.05)
            pids = {p for p in descendants(cli.pid) if not is_process_watchdog(p)}
            cli.send_signal(signal.SIGINT)
            code = await cli.wait()
        finally:
            if cli.returncode is None:
                cli.kill()
                with trio.CancelScope(shield=True):
                    await cli.wait()
    return code, pids, stdout_path.read_text(), stderr_path.read_text()


async def test_ctrl_c_interrupts_the_batch_then_resume_finishes_it(
    tmp_path: Path, state_dir: Path
) -> None:
    """SIGINT while one repository's agent runs `sleep 30`: exit 130, the batch and that
    repository interrupted, no agent or command left; resume finishes it."""
    names = ("fast", "slow")
    repos = [make_repo(tmp_path, n, remote=False) for n in names]
    (repos[1] / "SLOW").write_text("sleep here\n")
    pipeline = write_pipeline(tmp_path, SLOW_PIPELINE)
    argv = ["batch", str(pipeline), "--policy", "trusted", "--max-repos", "1", "--json"]
    argv += ["--git-branch", BRANCH]
    for repo in repos:
        argv += ["--repo", str(repo)]
    code, pids, stdout, stderr = await interrupt_when(
        argv, cwd=tmp_path, state=state_dir, out=tmp_path, ready="sleep 30"
    )
    assert code == EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr
    assert pids, "the agent and its command ran under the console script"
    assert all(pid_gone(p) for p in pids), [(p, command_line(p)) for p in pids if not pid_gone(p)]
    document = json.loads(stdout)
    jsonschema.Draft202012Validator(output_schema()).validate(document)
    listed = await runs_json(tmp_path, state_dir)
    [batch] = [r for r in listed if r["kind"] == "batch"]
    assert batch["status"] == "interrupted"
    assert (document["error"]["type"], document["runId"]) == ("Interrupted", batch["runId"])
    shown = await run_cli("show", batch["runId"], "--json", cwd=tmp_path, state=state_dir)
    entries = by_name(checked(shown, EXIT_OK))
    assert entries["fast"]["status"] == "succeeded"
    assert entries["slow"]["status"] == "interrupted"
    assert branch_commit(repos[0]) is not None and branch_commit(repos[1]) is None
    slow_run = entries["slow"]["runId"]
    assert slow_run is not None

    (repos[1] / "SLOW").unlink()
    resumed = await run_cli("resume", batch["runId"], "--json", cwd=tmp_path, state=state_dir)
    again = by_name(checked(resumed, EXIT_OK))
    assert again["slow"]["status"] == "succeeded" and again["slow"]["runId"] == slow_run
    assert again["fast"] == entries["fast"]
    assert branch_commit(repos[1]) == again["slow"]["branchCommit"] is not None


async def test_a_batch_runs_from_a_directory_holding_the_state_directory(
    tmp_path: Path, state_dir: Path
) -> None:
    """The batch's own directory is no workspace: one that holds the state directory (a home
    directory with the default one) runs the batch; only a repository may not hold it."""
    home = tmp_path / "home"
    home.mkdir()
    state = home / ".state"
    repo = make_repo(tmp_path, "svc", remote=False)
    pipeline = write_pipeline(tmp_path)
    argv = ["batch", str(pipeline), "--repo", str(repo), "--policy", "edit", "--json"]
    document = checked(await run_cli(*argv, cwd=home, state=state), EXIT_OK)
    assert [r["status"] for r in document["repos"]] == ["succeeded"]
