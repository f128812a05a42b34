"""Tests of loading pipeline files (tests/pipelines/) into validated pipelines."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from orchestrator.errors import PipelineError, UsageError
from orchestrator.pipeline import Budget, Pipeline, load_pipeline, load_pipeline_from_module, step

SAMPLES = Path(__file__).resolve().parent / "pipelines"


def load_error(path: str | Path) -> PipelineError:
    """The PipelineError that loading ``path`` raises (failing if it loads)."""
    with pytest.raises(PipelineError) as info:
        load_pipeline(path)
    return info.value


def test_a_diamond_loads_in_definition_order() -> None:
    """The diamond sample loads with its steps, order, inputs, path, name and digest."""
    path = SAMPLES / "diamond.py"
    pipeline = load_pipeline(path)
    assert pipeline.name == "diamond"
    assert pipeline.path == str(path)
    assert list(pipeline.steps) == ["plan", "frontend", "backend", "report"]
    assert pipeline.order() == ["plan", "frontend", "backend", "report"]
    assert pipeline.generations() == [["plan"], ["frontend", "backend"], ["report"]]
    assert pipeline.parents("report") == ["frontend", "backend"]
    assert list(pipeline.inputs) == ["task"]
    assert pipeline.steps["report"].wants_workdir
    assert pipeline.steps["plan"].description == "Write a short plan."
    assert pipeline.digest == hashlib.sha256(path.read_bytes()).hexdigest()


def test_fan_out_over_items_and_agents() -> None:
    """The fan-out sample keeps over=, agents, options, defaults and its PIPELINE_NAME."""
    pipeline = load_pipeline(SAMPLES / "fan_out_items.py")
    assert pipeline.name == "rewrite-each-file"
    transform = pipeline.steps["transform"]
    assert (transform.over, transform.merge, transform.retries, transform.timeout) == (
        "files",
        "union",
        1,
        600.0,
    )
    assert transform.fans_out
    review = pipeline.steps["review"]
    assert review.agents == ("claude", "codex")
    assert review.budget == Budget(max_tokens=5000)
    verify = pipeline.steps["verify"]
    assert verify.is_async
    assert verify.when_params == ("transform",)
    assert pipeline.order() == ["files", "transform", "review", "verify"]
    assert pipeline.check_inputs({"instructions": "add types"}) == {
        "pattern": "*.py",
        "instructions": "add types",
    }
    assert pipeline.inputs["pattern"].used_by == ("files", "verify")
    assert transform("a.py", "x") == "In a.py: x"


def test_a_duplicate_hidden_by_rebinding_is_caught() -> None:
    """A second def of the same step name is reported though the module keeps only one."""
    error = load_error(SAMPLES / "duplicate_step.py")
    assert error.problems == ("duplicate step 'plan': defined 2 times",)
    assert error.source == str(SAMPLES / "duplicate_step.py")


def test_a_cycle_in_a_file_is_named() -> None:
    """A file whose steps form a cycle fails, naming the cycle."""
    error = load_error(SAMPLES / "cycle.py")
    assert error.problems == ("cycle: plan -> review -> plan",)
    assert error.__cause__ is None


def test_a_misspelt_dependency_surfaces_as_a_missing_input() -> None:
    """A typo in a parameter loads as a run input, and check_inputs points at the step."""
    pipeline = load_pipeline(SAMPLES / "missing_input.py")
    assert list(pipeline.inputs) == ["task", "style", "plann"]
    with pytest.raises(PipelineError) as info:
        pipeline.check_inputs({"task": "x"})
    assert info.value.problems == (
        "missing input 'plann' (needed by implement); did you mean the step 'plan'?",
    )


def test_a_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    """A file that does not parse gives a PipelineError at its line, the SyntaxError as cause."""
    path = tmp_path / "broken.py"
    path.write_text("from orchestrator.pipeline import step\n\n@step\ndef plan(:\n    pass\n")
    error = load_error(path)
    assert error.source == f"{path}:4"
    assert error.problems[0].startswith("SyntaxError: ")
    assert str(error).startswith(f"{path}:4: SyntaxError: ")
    assert isinstance(error.__cause__, SyntaxError)


def test_an_import_error_names_the_file_and_line() -> None:
    """A failing import gives a PipelineError at the import line, the original as cause."""
    path = SAMPLES / "import_error.py"
    error = load_error(path)
    assert error.source == f"{path}:5"
    assert error.problems == (
        "ModuleNotFoundError: No module named 'no_such_module_for_pipeline_tests'",
    )
    assert isinstance(error.__cause__, ModuleNotFoundError)


def test_a_bad_step_option_names_the_decorator_line() -> None:
    """A UsageError from @step while the file runs is reported at the decorator's line."""
    path = SAMPLES / "bad_option.py"
    error = load_error(path)
    assert error.source == f"{path}:8"
    assert "merge='sometimes' is not one of" in error.problems[0]
    assert isinstance(error.__cause__, UsageError)


def test_a_relative_path_is_named_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Errors name the file as the user typed it; the pipeline keeps the absolute path."""
    monkeypatch.chdir(SAMPLES.parent)
    error = load_error("pipelines/import_error.py")
    assert error.source == "pipelines/import_error.py:5"
    error = load_error("pipelines/cycle.py")
    assert error.source == "pipelines/cycle.py"
    assert load_pipeline("pipelines/diamond.py").path == str(SAMPLES / "diamond.py")


def test_a_missing_file_or_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    """No such file, or a directory, is a plain UsageError (not a PipelineError)."""
    for path in (tmp_path / "nope.py", tmp_path):
        with pytest.raises(UsageError) as info:
            load_pipeline(path)
        assert not isinstance(info.value, PipelineError)
        assert str(tmp_path) in str(info.value)


def test_a_file_without_steps_is_refused(tmp_path: Path) -> None:
    """A file that defines no step fails validation."""
    path = tmp_path / "empty.py"
    path.write_text("X = 1\n")
    assert load_error(path).problems == ("no steps: decorate functions with @step",)


def test_a_bad_pipeline_name_is_refused(tmp_path: Path) -> None:
    """PIPELINE_NAME must be a non-empty string."""
    path = tmp_path / "named.py"
    path.write_text(
        "from orchestrator.pipeline import step\n"
        "PIPELINE_NAME = 3\n"
        "@step\n"
        "def plan() -> str:\n"
        "    return ''\n"
    )
    assert load_error(path).problems == ("PIPELINE_NAME must be a non-empty string, not 3",)


def test_steps_imported_from_a_module_beside_it_are_included() -> None:
    """An imported step joins the pipeline in import position; others in its module do not."""
    before = list(sys.path)
    pipeline = load_pipeline(SAMPLES / "uses_shared_steps.py")
    assert sys.path == before
    assert list(pipeline.steps) == ["lint", "fix", "summary"]
    assert pipeline.order() == ["lint", "fix", "summary"]
    assert list(pipeline.inputs) == ["paths"]
    assert pipeline.steps["lint"].fn.__module__ == "shared_steps"


def test_each_load_is_a_fresh_module_with_its_file() -> None:
    """Two loads of one file give separate modules (and steps), each with __file__ set."""
    path = SAMPLES / "uses_shared_steps.py"
    first = load_pipeline(path)
    second = load_pipeline(path)
    fix_one, fix_two = first.steps["fix"], second.steps["fix"]
    assert fix_one is not fix_two
    assert fix_one.fn.__module__ != fix_two.fn.__module__
    assert fix_one.fn.__globals__["HERE"] == str(path)
    assert fix_one.fn.__module__ in sys.modules


def test_the_file_runs_as_an_importable_module(tmp_path: Path) -> None:
    """Code that looks its module up (dataclasses with postponed annotations) works."""
    path = tmp_path / "with_dataclass.py"
    path.write_text(
        "from __future__ import annotations\n"
        "import dataclasses\n"
        "from orchestrator.pipeline import step\n"
        "@dataclasses.dataclass\n"
        "class Options:\n"
        "    level: dataclasses.InitVar[int]\n"
        "@step\n"
        "def plan() -> str:\n"
        "    return __name__\n"
    )
    pipeline = load_pipeline(path)
    assert pipeline.steps["plan"]().startswith("_orchestrator_pipeline_with_dataclass_")


def test_a_failed_load_leaves_no_module_and_no_path_entry(tmp_path: Path) -> None:
    """After a failure, sys.path is as before and the half-run module is forgotten."""
    path = tmp_path / "fails.py"
    path.write_text("import sys\nNAME = __name__\nraise RuntimeError(NAME)\n")
    modules = set(sys.modules)
    before = list(sys.path)
    error = load_error(path)
    assert error.source == f"{path}:3"
    assert error.problems[0].startswith("RuntimeError: _orchestrator_pipeline_fails_")
    assert sys.path == before
    assert set(sys.modules) == modules


def test_a_pipeline_from_an_imported_module() -> None:
    """load_pipeline_from_module takes the steps among a module's globals."""

    @step(agent="claude")
    def plan(task: str) -> str:
        return task

    @step
    def report(plan: object) -> str:
        return str(plan)

    module = ModuleType("myproject.pipes")
    module.plan = plan  # type: ignore[attr-defined]
    module.report = report  # type: ignore[attr-defined]
    module.helper = len  # type: ignore[attr-defined]
    pipeline = load_pipeline_from_module(module)
    assert pipeline.name == "pipes"
    assert pipeline.path is None
    assert list(pipeline.steps) == ["plan", "report"]
    assert pipeline.digest == hashlib.sha256(b"plan\nreport").hexdigest()

    module.PIPELINE_NAME = "named"  # type: ignore[attr-defined]
    assert load_pipeline_from_module(module).name == "named"


def test_a_pipeline_from_a_module_with_a_file_digests_the_file() -> None:
    """A module with a readable __file__ gets that path and the digest of its text."""
    loaded = load_pipeline(SAMPLES / "diamond.py")
    module = sys.modules[loaded.steps["plan"].fn.__module__]
    pipeline = load_pipeline_from_module(module)
    assert isinstance(pipeline, Pipeline)
    assert pipeline.path == str(SAMPLES / "diamond.py")
    assert pipeline.digest == loaded.digest
    assert list(pipeline.steps) == list(loaded.steps)


def test_an_invalid_module_is_reported_under_its_name() -> None:
    """Validation problems of a module without a file are prefixed with its name."""
    module = ModuleType("empty_pipes")
    with pytest.raises(PipelineError) as info:
        load_pipeline_from_module(module)
    assert info.value.source == "empty_pipes"
