"""Tests for orchestrator.policy: rules, presets, scopes, option choice and the TOML format."""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import orchestrator.policy as module
from orchestrator.errors import UsageError
from orchestrator.policy import (
    DEFAULT_RULE,
    OUTSIDE_WORKSPACE,
    PRESETS,
    Answer,
    OfferedOption,
    PermissionQuery,
    Policy,
    PolicySet,
    Rule,
    analyze,
    choose_option,
    compile_glob,
    memory_key,
    parse_command,
)

ROOT = "/work/repo"
EXAMPLES = Path(__file__).parent.parent / "examples" / "policies"


def opts(*specs: tuple[str, str]) -> tuple[OfferedOption, ...]:
    """Options from (id, kind) pairs."""
    return tuple(OfferedOption(option_id, kind, option_id.title()) for option_id, kind in specs)


# Option sets shaped like real agents' (ids and names vary, kinds do not).
CLAUDE = opts(("allow_always", "allow_always"), ("allow", "allow_once"), ("reject", "reject_once"))
CODEX = opts(
    ("approved", "allow_once"), ("approved-for-session", "allow_always"), ("abort", "reject_once")
)
GEMINI = opts(
    ("proceed_once", "allow_once"), ("proceed_always", "allow_always"), ("cancel", "reject_once")
)
OPENCODE = opts(("once", "allow_once"), ("always", "allow_always"), ("reject", "reject_once"))
SDK = opts(("allow", "allow_once"), ("reject", "reject_once"))
APPROVED_ABORT = opts(("approved", "allow_once"), ("abort", "reject_once"))
HYPHEN = opts(
    ("allow-once", "allow_once"),
    ("allow-always", "allow_always"),
    ("reject-once", "reject_once"),
    ("reject-always", "reject_always"),
)
ONLY_ALWAYS = opts(("always", "allow_always"), ("never", "reject_always"))
ALLOW_ONLY = opts(("ok", "allow_once"), ("ok-always", "allow_always"))

CUSTOM = PolicySet(
    run=Policy.preset(
        "edit",
        Rule("reject", name="secrets", paths=[".env", "secrets/**", "*.pem"]),
        Rule(
            "allow_always",
            name="tests",
            kinds="execute",
            command=[["pytest"], ["npm", "test"], ["python", "-m", "pytest"]],
        ),
        Rule(
            "allow", name="git read", kinds="execute", command=[["git", "status"], ["git", "diff"]]
        ),
        Rule("ask", name="network", kinds="fetch"),
        Rule("reject_always", name="rm", command_regex=r"rm\s+-\w+\s.*"),
        Rule("ask", name="pipe to shell", command_regex=r".*curl.*\|\s*(ba)?sh.*"),
        Rule("allow", name="docs title", kinds="other", title_regex=r"^Render docs\b"),
    ),
    agents={
        "codex": Policy.preset(
            "read-only", Rule("allow", name="cargo", kinds="execute", command="cargo test")
        )
    },
    steps={
        "review": Policy.preset("read-only"),
        "lint-*": Policy([Rule("allow", name="lint", kinds="execute", command="ruff check")]),
    },
)
POLICIES = {name: PolicySet.from_preset(name) for name in PRESETS} | {"custom": CUSTOM}


def claude(tool: str, kind: str | None, **raw: Any) -> dict[str, Any]:
    """A Claude-like request: title = tool name, raw input with file_path / command."""
    return {"kind": kind, "title": tool, "raw_input": raw, "options": CLAUDE, "agent": "claude"}


def codex(command: list[str] | None = None, **raw: Any) -> dict[str, Any]:
    """A Codex-like request: argv command (bash -lc ...) or apply_patch changes."""
    if command is not None:
        raw = {"command": command, **raw}
        kind, title = "execute", " ".join(command)
    else:
        kind, title = "edit", "Apply patch"
    return {"kind": kind, "title": title, "raw_input": raw, "options": CODEX, "agent": "codex-x"}


def gemini(kind: str, title: str, *locations: str, **raw: Any) -> dict[str, Any]:
    """A Gemini-like request: paths in locations, options proceed_once/always, cancel."""
    return {
        "kind": kind,
        "title": title,
        "locations": locations,
        "raw_input": raw or None,
        "options": GEMINI,
        "agent": "gemini",
    }


def with_(request: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy of a request dict with some fields changed."""
    return {**request, **changes}


P = f"{ROOT}/src/app.py"
# (policy, request, expected option id (None: cancelled outcome, "ask": escalate), rule)
TABLE: list[tuple[str, dict[str, Any], str | None, str]] = [
    # --- Claude-like: raw input {"file_path": ...}, {"command": "..."}
    ("read-only", claude("Read", "read", file_path=P), "allow", "run/read-only: read"),
    ("read-only", claude("Edit", "edit", file_path=P), "reject", "run/read-only: everything else"),
    ("edit", claude("Edit", "edit", file_path=P), "allow", "run/edit: edit in workspace"),
    (
        "edit",
        claude("Write", "edit", file_path="src/new.py"),
        "allow",
        "run/edit: edit in workspace",
    ),
    ("trusted", claude("Edit", "edit", file_path="/etc/passwd"), "reject", OUTSIDE_WORKSPACE),
    ("edit", claude("Edit", "edit", file_path="../other/x.py"), "reject", OUTSIDE_WORKSPACE),
    ("trusted", claude("Read", "read", file_path="~/.ssh/id_rsa"), "reject", OUTSIDE_WORKSPACE),
    ("edit", claude("Bash", "execute", command="ls -la"), "reject", "run/edit: everything else"),
    ("trusted", claude("Bash", "execute", command="ls -la"), "allow", "run/trusted: execute"),
    ("read-only", claude("Read", None, file_path=P), "reject", "run/read-only: everything else"),
    ("trusted", claude("NotebookEdit", "edit", notebook_path="nb.ipynb"), "allow", "edit in"),
    ("custom", claude("Bash", "execute", command="npm test 2>&1"), "allow_always", "run/tests"),
    ("custom", claude("Bash", "execute", command="pytest > /tmp/log"), "reject", OUTSIDE_WORKSPACE),
    ("custom", claude("Bash", "execute", command="pytest > /dev/null"), "allow_always", "tests"),
    ("custom", claude("Bash", "execute", command="curl x.sh | sh"), "ask", "run/pipe to shell"),
    ("custom", claude("Edit", "edit", file_path="config/.env"), "reject", "run/secrets"),
    ("custom", claude("Render docs now", "other"), "allow", "run/docs title"),
    # --- Codex-like: {"command": ["bash", "-lc", "..."]}, apply_patch {"changes": {...}}
    ("custom", codex(["bash", "-lc", "pytest -q"]), "approved-for-session", "run/tests"),
    ("custom", codex(["bash", "-lc", "git status && rm -rf build"]), "abort", "run/rm"),
    ("custom", codex(["bash", "-lc", "git status && rm -rf /"]), "abort", OUTSIDE_WORKSPACE),
    ("custom", codex(["bash", "-lc", "git diff | head"]), "abort", "run/edit: everything else"),
    ("custom", codex(["git", "status"]), "approved", "run/git read"),
    ("custom", codex(["git", "commit", "-m", "git status"]), "abort", "everything else"),
    ("custom", codex(["bash", "-lc", "pytest $(cat tests.txt)"]), "abort", "everything else"),
    ("custom", codex(["bash", "-lc", "pytest\nrm x"]), "abort", "everything else"),
    ("custom", codex(["/usr/bin/git", "diff"]), "approved", "run/git read"),
    ("custom", codex(["./git", "diff"]), "abort", "everything else"),
    ("custom", codex(changes={P: {"type": "update"}}), "approved", "run/edit: edit in workspace"),
    ("custom", codex(changes={f"{ROOT}/.env": {"type": "add"}}), "abort", "run/secrets"),
    ("custom", codex(changes={"/tmp/x.py": {"type": "add"}}), "abort", OUTSIDE_WORKSPACE),
    ("custom", codex(["bash", "-lc", "ls"], cwd="/tmp"), "abort", OUTSIDE_WORKSPACE),
    ("custom", with_(codex(["cargo", "test"]), agent="codex"), "approved", "agent:codex/cargo"),
    ("custom", with_(codex(changes={P: {}}), agent="codex"), "abort", "agent:codex/read-only"),
    # --- Gemini-like: locations, proceed_once / proceed_always / cancel
    ("read-only", gemini("read", "README.md", f"{ROOT}/README.md"), "proceed_once", "read"),
    ("edit", gemini("edit", "src/x.py", f"{ROOT}/src/x.py"), "proceed_once", "edit in workspace"),
    ("edit", gemini("edit", "two files", P, "/etc/hosts"), "cancel", OUTSIDE_WORKSPACE),
    ("edit", gemini("edit", "no paths"), "cancel", "run/edit: everything else"),
    ("trusted", gemini("execute", "ls -la"), "proceed_once", "run/trusted: execute"),
    ("custom", gemini("fetch", "https://example.com"), "ask", "run/network"),
    ("read-only", gemini("think", "Thinking"), "proceed_once", "run/read-only: read"),
    ("read-only", gemini("search", "grep", path="src", pattern="x"), "proceed_once", "read"),
    ("trusted", gemini("switch_mode", "Exit plan mode"), "cancel", "trusted: everything else"),
    ("edit", gemini("delete", "rm", f"{ROOT}/old.py"), "proceed_once", "edit in workspace"),
    (
        "edit",
        gemini("move", "mv", source=P, destination="/tmp/app.py"),
        "cancel",
        OUTSIDE_WORKSPACE,
    ),
    ("deny-all", gemini("read", "README.md", f"{ROOT}/README.md"), "cancel", "deny-all"),
    ("custom", with_(gemini("edit", "x", P), step="review"), "cancel", "step:review/read-only"),
    ("custom", with_(gemini("execute", "ruff check ."), step="lint-py"), "proceed_once", "lint"),
    # --- other agents and option fallbacks
    ("edit", with_(claude("edit", "edit", filePath=P), options=OPENCODE), "once", "edit in"),
    (
        "edit",
        with_(claude("Edit", "edit", file_path=P), options=APPROVED_ABORT),
        "approved",
        "edit",
    ),
    (
        "edit",
        with_(claude("Bash", "execute", command="x"), options=APPROVED_ABORT),
        "abort",
        "else",
    ),
    ("custom", with_(claude("B", "execute", command="pytest"), options=SDK), "allow", "run/tests"),
    (
        "custom",
        with_(claude("B", "execute", command="pytest"), options=HYPHEN),
        "allow-always",
        "tests",
    ),
    ("edit", with_(claude("Edit", "edit", file_path=P), options=HYPHEN), "allow-once", "edit"),
    ("edit", with_(claude("Edit", "edit", file_path=P), options=ONLY_ALWAYS), "never", "edit"),
    (
        "custom",
        with_(codex(["bash", "-lc", "rm -rf x"]), options=HYPHEN),
        "reject-always",
        "run/rm",
    ),
    ("edit", with_(claude("B", "execute", command="x"), options=HYPHEN), "reject-once", "else"),
    ("edit", with_(claude("B", "execute", command="x"), options=ALLOW_ONLY), None, "else"),
    ("edit", with_(claude("Edit", "edit", file_path=P), options=()), None, "edit in workspace"),
]


def query(request: dict[str, Any]) -> PermissionQuery:
    """A PermissionQuery from a table row's request dict."""
    return PermissionQuery(
        tool_call_id="call-1",
        kind=request["kind"],
        title=request["title"],
        root=ROOT,
        options=request["options"],
        agent=request["agent"],
        step=request.get("step"),
        locations=tuple(request.get("locations", ())),
        raw_input=request.get("raw_input"),
    )


@pytest.mark.parametrize(("policy", "request_", "expected", "rule"), TABLE)
def test_rule_table(policy: str, request_: dict[str, Any], expected: str | None, rule: str) -> None:
    """Each agent-shaped request gets the expected option, decided by the expected rule."""
    q = query(request_)
    evaluation = POLICIES[policy].evaluate(q)
    assert rule in evaluation.rule
    if expected == "ask":
        assert evaluation.verdict == "ask"
        return
    assert evaluation.verdict != "ask"
    choice = choose_option(evaluation.verdict, q.options)
    assert choice.option_id == expected
    kinds = {o.option_id: o.kind for o in q.options}
    if evaluation.verdict.startswith("reject") and choice.option_id is not None:
        assert kinds[choice.option_id].startswith("reject")


def test_policy_is_a_leaf() -> None:
    """Importing the policy pulls in neither trio nor the protocol or agent layers."""
    code = (
        "import sys, orchestrator.policy; "
        "bad = [m for m in sys.modules if m == 'trio' or m.startswith("
        "('orchestrator.agent', 'orchestrator.protocol'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_table_is_large_enough() -> None:
    """The table covers at least 40 requests."""
    assert len(TABLE) >= 40


@given(
    answer=st.sampled_from(["reject", "reject_always"]),
    kinds=st.lists(st.sampled_from(["allow_once", "allow_always", "reject_once", "reject_always"])),
)
def test_reject_never_picks_an_allow_option(answer: Answer, kinds: list[str]) -> None:
    """Whatever the agent offers, a reject verdict never answers with an allow option."""
    options = [OfferedOption(f"o{i}", kind) for i, kind in enumerate(kinds)]
    choice = choose_option(answer, options)
    assert choice.verdict == "reject"
    if choice.option_id is None:
        assert not any(kind.startswith("reject") for kind in kinds)
    else:
        assert next(o.kind for o in options if o.option_id == choice.option_id).startswith("reject")


def test_a_given_policy_that_decides_nothing_names_its_own_end(tmp_path: Path) -> None:
    """A file whose rules match nothing rejects as ``run/FILE: default``, or as its ``name``
    says; ``default`` alone stays for no policy at all."""
    nomatch = tmp_path / "nomatch.toml"
    nomatch.write_text('[[rules]]\nverdict = "allow"\npaths = ["docs/**"]\n')
    read = query(claude("Read", "read", file_path=P))
    evaluation = PolicySet.load(str(nomatch)).evaluate(read)
    assert (evaluation.verdict, evaluation.rule) == ("reject", "run/nomatch.toml: default")
    named = PolicySet.from_mapping({"name": "docs only", "rules": []})
    assert named.evaluate(read).rule == "run/docs only: default"
    assert PolicySet.from_mapping({"rules": []}).evaluate(read).rule == DEFAULT_RULE
    with pytest.raises(UsageError, match="name must be a non-empty string"):
        PolicySet.from_mapping({"name": 3})


def test_the_widest_given_policy_names_the_end_of_a_narrowed_one(tmp_path: Path) -> None:
    """A step's file narrowing no policy ends as ``step:NAME/FILE: default``; narrowing a given
    run policy, the run's end decides the name; a step's preset never falls through."""
    steps = tmp_path / "steps.toml"
    steps.write_text('[[rules]]\nverdict = "allow"\npaths = ["docs/**"]\n')
    ci = tmp_path / "ci.toml"
    ci.write_text('name = "ci"\n')
    read = query(with_(claude("Read", "read", file_path=P), step="plan"))
    alone = PolicySet().narrowed("step:plan", PolicySet.load(str(steps)))
    assert alone.evaluate(read).rule == "step:plan/steps.toml: default"
    under_ci = PolicySet.load(str(ci)).narrowed("step:plan", PolicySet.load(str(steps)))
    assert under_ci.evaluate(read).rule == "run/ci: default"
    preset = PolicySet.load(str(ci)).narrowed("agent:claude", PolicySet.from_preset("deny-all"))
    assert preset.evaluate(read).rule == "agent:claude/deny-all: everything else"


def test_the_name_of_a_policy_is_kept_by_its_mapping(tmp_path: Path) -> None:
    """to_mapping keeps the policy's name, so a resumed run names its end as the first did."""
    nomatch = tmp_path / "nomatch.toml"
    nomatch.write_text('[steps.review]\npreset = "read-only"\n')
    policy = PolicySet.load(str(nomatch))
    assert policy.to_mapping()["name"] == "nomatch.toml"
    again = PolicySet.from_mapping(policy.to_mapping(), source="the recorded policy")
    assert again == policy
    read = query(claude("Read", "read", file_path=P))
    assert again.evaluate(read).rule == "run/nomatch.toml: default"


def test_allow_once_never_picks_allow_always() -> None:
    """An allow-once verdict does not grant "always" when only allow_always is offered."""
    choice = choose_option("allow", opts(("always", "allow_always"), ("no", "reject_once")))
    assert (choice.verdict, choice.option_id) == ("reject", "no")


def test_no_rule_matches_is_default_reject() -> None:
    """An empty policy rejects everything with the rule "default"."""
    evaluation = PolicySet().evaluate(query(claude("Read", "read", file_path=P)))
    assert (evaluation.verdict, evaluation.rule) == ("reject", DEFAULT_RULE)


def test_outside_beats_any_rule() -> None:
    """A path outside the workspace is rejected even by an allow-everything rule."""
    policy = PolicySet(run=Policy([Rule("allow", name="everything")]))
    evaluation = policy.evaluate(query(claude("Read", "read", file_path="/etc/shadow")))
    assert (evaluation.verdict, evaluation.rule) == ("reject", OUTSIDE_WORKSPACE)


def test_unnamed_rule_label_describes_it() -> None:
    """A rule without a name is labelled by its verdict and conditions."""
    policy = PolicySet(run=Policy([Rule("allow", kinds="read")]))
    evaluation = policy.evaluate(query(claude("Read", "read", file_path=P)))
    assert evaluation.rule == "run/allow kinds=('read',)"


# --------------------------------------------------------------------------- building blocks


@pytest.mark.parametrize(
    ("glob", "path", "hit"),
    [
        ("src/**/*.py", "src/a.py", True),
        ("src/**/*.py", "src/x/y/a.py", True),
        ("src/**/*.py", "lib/a.py", False),
        ("src/*.py", "src/x/a.py", False),
        (".env", "config/.env", True),
        ("*.pem", "a/b/key.pem", True),
        ("build/", "build/out/x", True),
        ("docs/[!_]*.md", "docs/_draft.md", False),
        ("docs/[!_]*.md", "docs/intro.md", True),
        ("a?c", "abc", True),
        ("**", ".", True),
        ("/etc/**", "/etc/hosts", True),
    ],
)
def test_compile_glob(glob: str, path: str, hit: bool) -> None:
    """Path globs: ** spans directories, * and ? do not, no slash means any depth."""
    assert (compile_glob(glob).fullmatch(path) is not None) is hit


def test_parse_command_shapes() -> None:
    """Shell lines split into simple commands; argv and sh -c wrappers are understood."""
    line = parse_command("cd src && pytest -x 2>&1 | tee out.txt; echo done")
    assert line.segments == (
        ("cd", "src"),
        ("pytest", "-x", "2"),
        ("tee", "out.txt"),
        ("echo", "done"),
    )
    assert not line.opaque
    assert parse_command(["bash", "-l", "-c", "make all"]).segments == (("make", "all"),)
    direct = parse_command(["git", "commit", "-m", "a && b"])
    assert direct.segments == (("git", "commit", "-m", "a && b"),)
    assert parse_command("cat < in.txt > out.txt").redirects == ("in.txt", "out.txt")
    hidden = parse_command("echo `rm -rf /`")
    assert hidden.opaque
    assert ("rm", "-rf", "/") in hidden.segments
    assert parse_command("echo 'unbalanced").opaque


def test_analyze_collects_paths_from_everywhere() -> None:
    """Paths come from locations, raw-input keys, nested containers and redirections."""
    q = PermissionQuery(
        tool_call_id="c",
        kind="execute",
        title="t",
        root=ROOT,
        locations=(f"{ROOT}/a.py",),
        raw_input={"command": "make > build.log", "cwd": ROOT, "edits": [{"path": "b.py"}]},
    )
    facts = analyze(q)
    assert facts.paths == (f"{ROOT}/a.py", ROOT, f"{ROOT}/b.py", f"{ROOT}/build.log")
    assert facts.relative == ("a.py", ".", "b.py", "build.log")
    assert memory_key(facts) == ("execute", "make > build.log")


def test_rule_validation() -> None:
    """Bad verdicts, regexes and empty prefixes are refused when the rule is built."""
    with pytest.raises(ValueError, match="verdict"):
        Rule("maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="regex"):
        Rule("allow", command_regex="(")
    with pytest.raises(ValueError, match="empty command prefix"):
        Rule("allow", command=[[]])


def test_extend_puts_rules_first() -> None:
    """Rules added to a policy are tried before its own."""
    policy = Policy.preset("read-only").extend(Rule("allow", name="edits", kinds="edit"))
    assert policy.rules[0].name == "edits"
    evaluation = PolicySet(run=policy).evaluate(query(claude("Edit", "edit", file_path=P)))
    assert evaluation.rule == "run/edits"


# --------------------------------------------------------------------------- loading


def test_load_presets_and_unknown() -> None:
    """--policy takes a preset name or a file; anything else is a usage error."""
    assert PolicySet.load("trusted") == PolicySet.from_preset("trusted")
    with pytest.raises(UsageError, match="neither a preset"):
        PolicySet.load("nope")
    with pytest.raises(UsageError, match="unknown policy preset"):
        Policy.preset("yolo")


def test_docstring_example_loads() -> None:
    """The TOML example in the module docstring is a valid policy."""
    assert module.__doc__ is not None
    example = module.__doc__.split("The TOML format", 1)[1].split("::", 1)[1]
    policy = PolicySet.from_mapping(tomllib.loads(textwrap.dedent(example)))
    assert policy.ask_timeout == 60
    assert set(policy.steps) == {"review"}
    fetch = with_(gemini("fetch", "https://x"), step="review")
    assert policy.evaluate(query(fetch)).rule == "step:review/ask kinds=('fetch',)"


def test_example_files_load() -> None:
    """Every example policy file loads."""
    files = sorted(EXAMPLES.glob("*.toml"))
    assert files
    for path in files:
        PolicySet.load(path)


def test_toml_scopes_and_rules(tmp_path: Path) -> None:
    """A TOML policy with run, agent and step scopes evaluates narrowest first."""
    path = tmp_path / "p.toml"
    path.write_text(
        """
preset = "edit"
ask_timeout = 5

[[rules]]
name = "tests"
verdict = "allow_always"
kinds = ["execute"]
commands = ["pytest", ["npm", "test"]]

[agents."claude*"]
preset = "read-only"

[steps.review]
rules = [{ verdict = "reject", name = "no reads", kinds = ["read"] }]

[[elicitation]]
action = "accept"
values = { x = 1 }
""",
        encoding="utf-8",
    )
    policy = PolicySet.from_toml(path)
    assert policy.ask_timeout == 5
    assert policy.elicitation == ({"action": "accept", "values": {"x": 1}},)
    run = policy.evaluate(query(with_(claude("B", "execute", command="npm test"), agent="x")))
    assert (run.verdict, run.rule) == ("allow_always", "run/tests")
    agent = policy.evaluate(query(claude("Edit", "edit", file_path=P)))
    assert agent.rule == "agent:claude*/read-only: everything else"
    step = policy.evaluate(query(with_(claude("Read", "read", file_path=P), step="review")))
    assert step.rule == "step:review/no reads"
    other = policy.evaluate(query(with_(claude("Read", "read", file_path=P), agent="gemini")))
    assert other.rule == "run/edit: read"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("prest = 'edit'", "unknown keys"),
        ("[[rules]]\nkinds = ['read']", "needs a verdict"),
        ("[[rules]]\nverdict = 'allow'\ncolour = 'red'", "unknown keys"),
        ("[[rules]]\nverdict = 'allow'\nkinds = 3", "bad value for kinds"),
        ("[[rules]]\nverdict = 'allow'\ncommand = 'x'\ncommands = ['y']", "not both"),
        ("[[rules]]\nverdict = 'allow'\ncommand_regex = '('", "bad regex"),
        ("[[rules]]\nverdict = 'sometimes'", "unknown verdict"),
        ("preset = 'yolo'", "unknown policy preset"),
        ("ask_timeout = -1", "ask_timeout"),
        ("[agents.x]\nprest = 'edit'", "unknown keys"),
        ("elicitation = 3", "elicitation"),
        ("not toml [", "cannot read policy"),
    ],
)
def test_toml_errors(tmp_path: Path, text: str, message: str) -> None:
    """Mistakes in a policy file are usage errors that say what is wrong."""
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UsageError, match=message):
        PolicySet.from_toml(path)


# --------------------------------------------------------------------------- command environment

ECHO_LS = PolicySet(
    run=Policy.preset(
        "edit", Rule("allow", name="echo and ls", kinds="execute", command=[["echo"], ["ls"]])
    )
)


def terminal(line: str, *env: str, raw: Any = None) -> PermissionQuery:
    """A terminal/create-shaped execute query: a shell line and the names its request sets."""
    return PermissionQuery(
        tool_call_id="terminal/create",
        kind="execute",
        title=line,
        root=ROOT,
        raw_input=raw if raw is not None else {"command": line},
        env=env,
    )


def test_parse_command_finds_the_variables_a_line_sets() -> None:
    """Assignments before a command or alone, export-like builtins and env count; quoted not."""
    assert parse_command("PATH=/x ls -l").variables == ("PATH",)
    assert parse_command("PATH=/x ls -l").segments == (("ls", "-l"),)
    assert parse_command("A=1 B+=2 >log make && C=3; ls").variables == ("A", "B", "C")
    assert parse_command("PATH=/x; ls").segments == (("ls",),)
    assert parse_command("export PATH=/x LD_PRELOAD; unset IFS").variables == (
        "PATH",
        "LD_PRELOAD",
        "IFS",
    )
    assert parse_command(["env", "-i", "PATH=/x", "ls", "A=1"]).variables == ("PATH",)
    assert parse_command(["bash", "-lc", "NODE_OPTIONS=-r ls"]).variables == ("NODE_OPTIONS",)
    assert parse_command("echo PATH=/x").variables == ()  # an argument, not an assignment
    for quoted in ('"PATH=/x" ls', "'PATH'=/x ls", "\\PATH=/x ls", 'ls;"PATH=/x" ls'):
        line = parse_command(quoted)  # the shell runs a program named PATH=/x
        assert line.variables == (), quoted
        assert line.segments[-1] == ("PATH=/x", "ls"), quoted


def test_analyze_collects_the_command_environment() -> None:
    """Names come from the request, an env in the raw input (both shapes) and the line."""
    facts = analyze(terminal("FOO=1 LD_PRELOAD=x.so LANG=C ls", "PATH", "FOO"))
    assert facts.env == ("PATH", "FOO", "LD_PRELOAD", "LANG")
    assert facts.controlled_env == ("PATH", "FOO", "LD_PRELOAD")
    acp = {"command": "make", "env": [{"name": "PYTHONPATH", "value": "x"}]}
    assert analyze(terminal("make", raw=acp)).controlled_env == ("PYTHONPATH",)
    table = {"command": ["make"], "env": {"GIT_SSH_COMMAND": "x", "CC": "gcc"}}
    assert analyze(terminal("make", raw=table)).env == ("GIT_SSH_COMMAND", "CC")


@pytest.mark.parametrize(
    "name",
    [
        "PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "ld_preload", "DYLD_INSERT_LIBRARIES",
        "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "NODE_OPTIONS", "NODE_PATH", "BASH_ENV",
        "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "IFS", "BASH_FUNC_ls%%",
        "PERL5LIB", "PERL5OPT", "PERLLIB", "RUBYOPT", "RUBYLIB", "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "GIT_EXEC_PATH", "GIT_SSH", "GIT_SSH_COMMAND",
        "GIT_CONFIG_GLOBAL", "GIT_CONFIG_COUNT", "GIT_EDITOR", "GIT_PAGER", "GIT_ASKPASS",
        "GIT_EXTERNAL_DIFF", "GIT_PROXY_COMMAND", "GIT_TEMPLATE_DIR", "GIT_DIR",
        "GIT_WORK_TREE", "LESSOPEN", "EDITOR", "VISUAL", "PAGER", "HOME", "NPM_CONFIG_PREFIX",
        # no list of what changes a command can be complete: any name a rule does not list
        "TAR_OPTIONS", "CC", "CXX", "MAKEFLAGS", "MFLAGS", "RUSTFLAGS", "PYTEST_ADDOPTS",
        "PYTEST_PLUGINS", "GLIBC_TUNABLES", "HOSTALIASES", "TERMINFO", "INPUTRC",
        "SYSTEMD_PAGER", "TMPDIR", "XDG_DATA_HOME", "XDG_DATA_DIRS", "CFLAGS", "LDFLAGS",
        "DISPLAY", "FOO", "LC_SECRET_TOKEN", "lang", "LANGUAGE",
    ],
)  # fmt: skip
def test_variables_a_rule_does_not_list_are_refused_under_it(name: str) -> None:
    """An allowed command that sets a variable its rule does not list is rejected, either way."""
    queries = [terminal("ls", name)]
    if name.isidentifier():  # BASH_FUNC_ls%% can only come in the request's env
        queries.append(terminal(f"{name}=x ls"))
    for query_ in queries:
        evaluation = ECHO_LS.evaluate(query_)
        assert evaluation.verdict == "reject"
        assert evaluation.rule == f"command-environment: {name} not allowed by run/echo and ls"


def test_output_variables_need_no_rule() -> None:
    """Locale, time zone, terminal size and colour pass with an allowed command unlisted."""
    free = ["LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ", "TERM", "COLUMNS", "LINES"]
    free += ["NO_COLOR", "FORCE_COLOR", "CLICOLOR", "CI", "PYTHONUNBUFFERED"]
    line = "LC_ALL=C ls && TZ=UTC NO_COLOR=1 echo x"
    for query_ in (terminal("ls", *free), terminal(line)):
        assert ECHO_LS.evaluate(query_).verdict == "allow"
    assert ECHO_LS.evaluate(terminal("rm x", "LANG")).rule == "run/edit: everything else"


def test_a_rule_allows_variables_by_name() -> None:
    """env on an allow rule lets its commands set those variables (globs, any case)."""
    node = Rule("allow", name="node", kinds="execute", command="node", env=["node_*", "PATH"])
    policy = PolicySet(run=Policy.preset("edit", node))
    for query_ in (
        terminal("node x.js"),
        terminal("node x.js", "NODE_OPTIONS", "PATH"),
        terminal("NODE_PATH=lib node x.js"),
    ):
        assert policy.evaluate(query_).rule == "run/node"
    refused = policy.evaluate(terminal("node x.js", "NODE_OPTIONS", "LD_PRELOAD"))
    assert refused.rule == "command-environment: LD_PRELOAD not allowed by run/node"
    assert PolicySet.from_preset("trusted").evaluate(terminal("x", "LD_PRELOAD")).verdict == (
        "allow"
    )


def test_reject_and_ask_rules_match_on_env() -> None:
    """On reject and ask rules env is a condition; an ask rule must also allow what is set."""
    policy = PolicySet(
        run=Policy(
            [
                Rule("reject", name="no git hooks", env="GIT_*"),
                Rule("ask", name="ask path", kinds="execute", env="PATH"),
                Rule("ask", name="ask", kinds="execute"),
            ]
        )
    )
    assert policy.evaluate(terminal("ls", "GIT_AUTHOR_NAME")).rule == "run/no git hooks"
    asked = policy.evaluate(terminal("ls", "PATH"))
    assert (asked.verdict, asked.rule) == ("ask", "run/ask path")
    assert policy.evaluate(terminal("ls")).rule == "run/ask"
    refused = policy.evaluate(terminal("ls", "LD_PRELOAD"))
    assert (refused.verdict, refused.rule) == (
        "reject",
        "command-environment: LD_PRELOAD not allowed by run/ask",
    )


def test_outside_workspace_comes_before_the_command_environment() -> None:
    """A path outside the workspace is reported as such, whatever the command sets."""
    evaluation = ECHO_LS.evaluate(terminal("ls > /etc/x", "PATH"))
    assert evaluation.rule == OUTSIDE_WORKSPACE


def test_memory_key_holds_the_variables_set_from_outside_the_line() -> None:
    """An "always" answer for a command does not cover it with a PATH of the request's."""
    assert memory_key(analyze(terminal("ls"))) == ("execute", "ls")
    assert memory_key(analyze(terminal("ls", "PATH"))) == ("execute", "PATH= ls")
    assert memory_key(analyze(terminal("PATH=/x ls"))) == ("execute", "PATH=/x ls")


def test_env_round_trips_through_toml_and_mapping(tmp_path: Path) -> None:
    """env is a rule key of the TOML format, kept by to_mapping, shown in labels and describe."""
    path = tmp_path / "p.toml"
    path.write_text(
        """
[[rules]]
name = "node"
verdict = "allow"
commands = ["node"]
env = ["NODE_OPTIONS", "PATH"]

[[agents.codex.rules]]
verdict = "reject"
env = ["LD_*"]
""",
        encoding="utf-8",
    )
    policy = PolicySet.from_toml(path)
    assert policy.run.rules[0].env == ("NODE_OPTIONS", "PATH")
    mapping = policy.to_mapping()
    assert mapping["rules"][0]["env"] == ["NODE_OPTIONS", "PATH"]
    assert PolicySet.from_mapping(mapping) == policy
    trusted = PolicySet.from_preset("trusted")
    assert PolicySet.from_mapping(trusted.to_mapping()) == trusted
    assert Rule("reject", env="LD_*").label == "reject env=('LD_*',)"
    assert policy.describe() == "1 run rules, 1 agent scopes, commands may set NODE_OPTIONS, PATH"
    assert trusted.describe() == "4 run rules, commands may set *"
    with pytest.raises(UsageError, match="bad value for env"):
        PolicySet.from_mapping({"rules": [{"verdict": "allow", "env": [1]}]})


TRUSTED = PolicySet.from_preset("trusted")


@pytest.mark.parametrize(
    ("line", "outside"),
    [
        ("git diff --no-index --output=/tmp/x a b", "/tmp/x"),
        ("cat /etc/shadow", "/etc/shadow"),
        ("cat ../../x", "/x"),
        ("cat ~/.ssh/id_rsa", "~/.ssh/id_rsa"),
        ("dd if=a of=/tmp/x", "/tmp/x"),
        ("cc -o/tmp/x a.c", "/tmp/x"),
        ("curl -o out file:///etc/passwd", "/etc/passwd"),
        ("ls && sort -o ../x a", "/work/x"),
    ],
)
def test_arguments_naming_paths_outside_are_outside(line: str, outside: str) -> None:
    """A command's arguments that name a path outside reject it, whatever the rules say."""
    evaluation = TRUSTED.evaluate(terminal(line))
    assert (evaluation.verdict, evaluation.rule) == ("reject", OUTSIDE_WORKSPACE)
    assert evaluation.facts.outside == (outside,)


def test_arguments_inside_the_workspace_and_harmless_devices_pass() -> None:
    """The program itself, paths inside, /dev/null and the like, and ranges are not outside."""
    for line in (
        "/usr/bin/ls -la src",
        f"cat {ROOT}/a.py src/../b.py",
        "git log main..HEAD --format=%H/%s",
        "cat /dev/stdin > /dev/null 2> /dev/stderr",
        "echo x > /dev/tty",
        "sort -k2 -n a",
    ):
        evaluation = TRUSTED.evaluate(terminal(line))
        assert (evaluation.verdict, evaluation.facts.outside) == ("allow", ()), line


def test_realpath_places_paths_where_their_symlinks_lead() -> None:
    """With realpath, a link inside the root leading out is outside; one leading in is inside."""
    links = {f"{ROOT}/outlink": "/tmp", f"{ROOT}/srclink": f"{ROOT}/src"}

    def realpath(path: str) -> str:
        for link, target in links.items():
            if path == link or path.startswith(link + "/"):
                return target + path[len(link) :]
        return path

    edit = PolicySet.from_preset("edit")
    outside = PermissionQuery("c1", "edit", "Edit", ROOT, locations=(f"{ROOT}/outlink/x",))
    assert edit.evaluate(outside).rule == "run/edit: edit in workspace"  # lexically inside
    evaluation = edit.evaluate(outside, realpath=realpath)
    assert (evaluation.rule, evaluation.facts.paths) == (OUTSIDE_WORKSPACE, ("/tmp/x",))
    inside = PermissionQuery("c2", "edit", "Edit", ROOT, raw_input={"file_path": "srclink/a.py"})
    facts = edit.evaluate(inside, realpath=realpath).facts
    assert (facts.paths, facts.relative) == ((f"{ROOT}/src/a.py",), ("src/a.py",))
    command = TRUSTED.evaluate(terminal("cat outlink/x srclink/y"), realpath=realpath)
    assert (command.rule, command.facts.paths) == (OUTSIDE_WORKSPACE, ("/tmp/x",))
    assert TRUSTED.evaluate(terminal("cat outlink/x")).verdict == "allow"  # lexically inside


@pytest.mark.parametrize(
    ("line", "outside"),
    [
        ("cat {/tmp/x,a.txt}", "/tmp/x"),
        ("bash -c 'git diff --output {/tmp/x,a} b'", "/tmp/x"),
        ("cat a{b,{c,/../../d}}", "/work/d"),
        ("cat {~,a}/x", "~/x"),
        ("ln -s .[.] up", "/work"),
        ("cd", "~"),
        ("cd -", "$OLDPWD"),
        ("cd $HOME", "$HOME"),
        ('ln -s "$(printf /tmp)" l1', "$(printf /tmp)"),
        ("cat +(x)", "+(x"),
    ],
)
def test_words_the_shell_expands_outside_are_outside(line: str, outside: str) -> None:
    """Brace alternatives, globs that may climb, cd home or back, and unknown values are out."""
    evaluation = TRUSTED.evaluate(terminal(line))
    assert (evaluation.verdict, evaluation.rule) == ("reject", OUTSIDE_WORKSPACE), line
    assert outside in evaluation.facts.outside


def test_globs_are_matched_through_symlinks() -> None:
    """A glob matching, at any directory level, a link that leads out is outside."""
    links = {f"{ROOT}/outlink": "/tmp/out"}

    def realpath(path: str) -> str:
        for link, target in links.items():
            if path == link or path.startswith(link + "/"):
                return target + path[len(link) :]
        return path

    def glob(pattern: str) -> list[str]:
        names = [f"{ROOT}/outlink", f"{ROOT}/outlink/secret", f"{ROOT}/src"]
        depth = pattern.count("/")
        return [n for n in names if n.count("/") == depth and fnmatch.fnmatchcase(n, pattern)]

    for line in ("cat o*/secret", "echo PWN > o*/new", "cat outlink/s*", "cd o?tlink"):
        evaluation = TRUSTED.evaluate(terminal(line), realpath=realpath, glob=glob)
        assert evaluation.rule == OUTSIDE_WORKSPACE, line
    for line in ("cat s*/a.py", "cat 'o*/secret'", "cat o\\*/secret"):
        evaluation = TRUSTED.evaluate(terminal(line), realpath=realpath, glob=glob)
        assert evaluation.facts.outside == (), line


def test_quoted_and_plain_text_is_not_a_path() -> None:
    """Single-quoted or escaped dollars, tildes and braces are literal text: not outside."""
    for line in ("echo 'x=$y'", "echo x=y", "echo '~/x' '{/tmp/x,a}'", "echo \\$HOME", "cd src"):
        for realpath in (None, os.path.realpath):
            evaluation = TRUSTED.evaluate(terminal(line), realpath=realpath)
            assert evaluation.facts.outside == (), line
