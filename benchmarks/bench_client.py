"""Client benchmark: our ACP client against the official Python SDK and a bare stdlib loop.

Run ``.venv/bin/python benchmarks/bench_client.py`` (``--quick`` for a short run, ``--help``
for the flags). Every client talks to the same agent (``flood_agent.py``), each run in a fresh
process so imports and garbage collection do not leak from one to the next. Scenarios:

- ``flood``: one agent sends N ``session/update`` message chunks in one turn;
- ``rtt``: one agent makes N sequential ``fs/read_text_file`` round trips in one turn;
- ``multi``: K agents flood M updates each at once, read by one client process;
- ``cli``: the whole ``orchestrator prompt --json`` process on the N flood, against an SDK
  client process (and a bare one) that prints the same reply as JSON.

Times: *turn* is from the prompt sent to the prompt answered (measured inside the client);
*total* from spawning the client process to the end of the turn; *exit* to the process's exit.
The report gives ratios between clients measured in the same run, checked against the targets;
the JSON goes to ``benchmarks/results/client.json``. It is a script to run, never a test.

With ``--worker`` this file is itself the "ours" client process (used by the driver).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from attrs import define
from bare_client import AGENT, FILE_CONTENT, Probe
from flood_agent import expected_chars

from orchestrator.agent.client import open_agent
from orchestrator.agent.services import ClientServices, SessionContext
from orchestrator.agent.transcript import TranscriptWriter
from orchestrator.protocol import types as t

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "client.json"
CLIENTS = ("bare", "ours", "sdk")
SCENARIOS = ("flood", "rtt", "multi", "cli")

# --------------------------------------------------------------------------- the "ours" worker


@define
class _Counter:
    """The on_update callback: counts typed message chunks and their text."""

    updates: int = 0
    chars: int = 0

    def on_update(self, update: t.SessionUpdate) -> None:
        if isinstance(update, t.AgentMessageChunk) and isinstance(update.content, t.TextContent):
            self.updates += 1
            self.chars += len(update.content.text)


@define
class _BenchFs:
    """Answers every read with the same small file."""

    round_trips: int = 0

    async def read_text_file(
        self, request: t.ReadTextFileRequest, ctx: SessionContext
    ) -> t.ReadTextFileResponse:
        self.round_trips += 1
        return t.ReadTextFileResponse(content=FILE_CONTENT)

    async def write_text_file(
        self, request: t.WriteTextFileRequest, ctx: SessionContext
    ) -> t.WriteTextFileResponse:
        return t.WriteTextFileResponse()

    # the content is in memory: answered at once, as the VFS service answers small files
    def read_text_file_nowait(
        self, request: t.ReadTextFileRequest, ctx: SessionContext
    ) -> t.ReadTextFileResponse:
        self.round_trips += 1
        return t.ReadTextFileResponse(content=FILE_CONTENT)

    def write_text_file_nowait(
        self, request: t.WriteTextFileRequest, ctx: SessionContext
    ) -> t.WriteTextFileResponse:
        return t.WriteTextFileResponse()


async def _ours_one(
    argv: list[str],
    text: str,
    counter: _Counter,
    fs: _BenchFs,
    probe: Probe,
    ready: Callable[[], None] | None = None,
    go: trio.Event | None = None,
    transcript: Path | None = None,
) -> str | None:
    """One agent, one turn; returns the stop reason. With ``transcript`` the wire goes to
    that file, as ``--transcript`` writes it."""
    writer = TranscriptWriter(transcript, agent="flood") if transcript is not None else None
    services = ClientServices(fs=fs)
    async with open_agent(argv, name="flood", services=services, transcript=writer) as conn:
        session = await conn.new_session(os.getcwd())
        if ready is not None and go is not None:
            ready()
            await go.wait()
        else:
            probe.mark("sent")
        result = await session.prompt(text, on_update=counter.on_update)
        probe.mark("end")  # with many agents, the last one to finish leaves its mark
        if len(result.text) != counter.chars:  # the accumulated text agrees with the callback
            raise AssertionError(f"turn text {len(result.text)} chars, counted {counter.chars}")
        return result.stop_reason


async def _ours_many(
    argv: list[str], agents: int, text: str, probe: Probe, transcripts: Path | None
) -> dict[str, Any]:
    counters = [_Counter() for _ in range(agents)]
    ready_count = 0
    all_ready = trio.Event()
    go = trio.Event()

    def ready() -> None:
        nonlocal ready_count
        ready_count += 1
        if ready_count == agents:
            all_ready.set()

    async def one(counter: _Counter, transcript: Path | None) -> None:
        await _ours_one(argv, text, counter, _BenchFs(), probe, ready, go, transcript)

    async with trio.open_nursery() as nursery:
        for i, counter in enumerate(counters):
            nursery.start_soon(one, counter, transcripts / f"{i}.jsonl" if transcripts else None)
        await all_ready.wait()
        probe.mark("sent")
        go.set()
    return {
        "updates": sum(c.updates for c in counters),
        "chars": sum(c.chars for c in counters),
    }


def _worker(args: argparse.Namespace) -> int:
    # as the CLI does by default: warnings and up, on stderr
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    argv = [args.python, str(args.agent)]
    probe = Probe()
    result: dict[str, Any]
    folder = Path(args.transcript_dir) if args.transcript_dir else None
    if args.scenario == "multi":
        text = f"flood {args.count}"
        result = trio.run(_ours_many, argv, args.agents, text, probe, folder)
    else:
        mode = "rtt" if args.scenario == "rtt" else "flood"
        counter, fs = _Counter(), _BenchFs()
        wire = folder / "wire.jsonl" if folder else None
        text = f"{mode} {args.count}"
        stop = trio.run(_ours_one, argv, text, counter, fs, probe, None, None, wire)
        result = {"stop_reason": stop, "updates": counter.updates, "chars": counter.chars}
        result["round_trips"] = fs.round_trips
    result.update(probe.report())
    sys.stdout.write(json.dumps({"client": "ours", "scenario": args.scenario, **result}) + "\n")
    return 0


# --------------------------------------------------------------------------- the driver


@define
class _Plan:
    """The sizes of one benchmark run."""

    flood: int
    rtt: int
    agents: int
    per_agent: int
    python: str
    agent: Path
    #: where "ours" writes its wire transcripts (``--transcript``), or None
    transcripts: Path | None = None

    def expected(self, scenario: str) -> dict[str, Any]:
        if scenario == "rtt":
            return {"round_trips": self.rtt}
        if scenario == "multi":
            return {
                "updates": self.agents * self.per_agent,
                "chars": self.agents * expected_chars(self.per_agent),
            }
        return {"updates": self.flood, "chars": expected_chars(self.flood)}

    def label(self, scenario: str) -> str:
        return {
            "flood": f"flood: {self.flood:,} updates, 1 agent",
            "rtt": f"round trips: {self.rtt:,}, 1 agent",
            "multi": f"multi: {self.agents} agents x {self.per_agent:,} updates",
            "cli": f"whole process: prompt --json, {self.flood:,} updates",
        }[scenario]

    def command(self, client: str, scenario: str) -> list[str]:
        if scenario == "cli" and client == "ours":
            agent = f"{shlex.quote(self.python)} {shlex.quote(str(self.agent))}"
            return [
                *_orchestrator_cli(),
                "prompt",
                "--agent",
                agent,
                "--json",
                *(
                    ("--transcript", str(self.transcripts / "cli.jsonl"))
                    if self.transcripts
                    else ()
                ),
                f"flood {self.flood}",
            ]
        script = {"bare": [str(HERE / "bare_client.py")], "sdk": [str(HERE / "sdk_client.py")]}
        head = [sys.executable, *script.get(client, [str(Path(__file__).resolve()), "--worker"])]
        count = {"flood": self.flood, "cli": self.flood, "rtt": self.rtt}.get(
            scenario, self.per_agent
        )
        wire = ("--transcript-dir", str(self.transcripts)) if self.transcripts else ()
        return [
            *head,
            *("--scenario", scenario, "--count", str(count), "--agents", str(self.agents)),
            *("--python", self.python, "--agent", str(self.agent)),
            *(wire if client == "ours" else ()),
        ]


def _byte_compile_package() -> None:
    """Byte-compile the orchestrator package, as installing it from a wheel does.

    An editable install under ``PYTHONDONTWRITEBYTECODE`` would otherwise compile every
    module from source at each process start, while the SDK's installed modules are compiled.
    """
    import compileall

    import orchestrator

    compileall.compile_dir(Path(orchestrator.__file__).parent, quiet=1)


def _orchestrator_cli() -> list[str]:
    script = Path(sys.executable).with_name("orchestrator")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from orchestrator.cli import main; sys.exit(main())"]


def _run(plan: _Plan, client: str, scenario: str) -> dict[str, Any]:
    """Run one client process; its times and counts, or an error."""
    command = plan.command(client, scenario)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(command, capture_output=True, timeout=3600, check=False)
    except subprocess.TimeoutExpired:
        return {"client": client, "scenario": scenario, "error": "no result within an hour"}
    t_exit = time.monotonic()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    tree_cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    run: dict[str, Any] = {"client": client, "scenario": scenario, "exit": t_exit - t0}
    run["tree_cpu"] = tree_cpu
    try:
        run.update(_check(plan, scenario, proc, t0))
    except (ValueError, KeyError, IndexError) as e:
        tail = proc.stderr.decode(errors="replace")[-2000:]
        run["error"] = f"{e}\n{tail}".strip()
    return run


def _check(
    plan: _Plan, scenario: str, proc: subprocess.CompletedProcess[bytes], t0: float
) -> dict[str, Any]:
    """The figures a client process reported, once its counts are checked."""
    expected = plan.expected(scenario)
    if proc.returncode != 0:
        raise ValueError(f"exit status {proc.returncode}")
    if scenario == "cli":
        reply = json.loads(proc.stdout)
        got = {"stopReason": reply["stopReason"], "chars": len(reply["text"])}
        if got != {"stopReason": "end_turn", "chars": expected["chars"]}:
            raise ValueError(f"wrong reply: {got}, expected {expected['chars']} chars")
        return {}
    out = json.loads(proc.stdout.splitlines()[-1])
    wrong = {k: (out.get(k), v) for k, v in expected.items() if out.get(k) != v}
    if wrong or out.get("stop_reason", "end_turn") != "end_turn":
        raise ValueError(f"wrong counts (got, expected): {wrong}, {out.get('stop_reason')}")
    return {
        "turn": out["t_end"] - out["t_sent"],
        "cpu": out["cpu"],
        "gc": out["gc"],
        "total": out["t_end"] - t0,
        "gc_collections": out["gc_collections"],
    }


#: the figures of a run, best (lowest) of the repeats kept for each
METRICS = ("turn", "cpu", "gc", "total", "exit", "tree_cpu")
#: the ratios reported, numerator/denominator
PAIRS = (("ours", "bare"), ("sdk", "bare"), ("sdk", "ours"))
#: (scenario, figure, numerator, denominator, "max" or "min", bound): the issue's targets
TARGETS: list[tuple[str, str, str, str, str, float]] = [
    ("flood", "turn", "ours", "bare", "max", 1.5),
    ("flood", "turn", "sdk", "ours", "min", 5.0),
    ("rtt", "turn", "sdk", "ours", "min", 2.5),
    ("multi", "turn", "ours", "bare", "max", 1.5),
    ("multi", "turn", "sdk", "ours", "min", 10.0),
    ("cli", "exit", "sdk", "ours", "min", 5.0),
]


def _verdict(value: float | None, kind: str, bound: float) -> bool | None:
    if value is None:
        return None
    return value <= bound if kind == "max" else value >= bound


def _summarise(plan: _Plan, runs: list[dict[str, Any]], scenario: str) -> dict[str, Any]:
    """Best figures per client, the ratios between clients, and the targets' verdicts."""
    best: dict[str, dict[str, float]] = {}
    for run in runs:
        if run["scenario"] == scenario and "error" not in run:
            slot = best.setdefault(run["client"], {})
            for metric in METRICS:
                if metric in run:
                    slot[metric] = min(slot.get(metric, math.inf), run[metric])
    work = plan.rtt if scenario == "rtt" else plan.expected(scenario).get("updates", 0)
    if scenario != "cli":
        for figures in best.values():
            figures["rate"] = work / figures["turn"]
    ratios: dict[str, dict[str, float]] = {}
    for num, den in PAIRS:
        if num in best and den in best:
            ratios[f"{num}/{den}"] = {
                m: best[num][m] / best[den][m]
                for m in METRICS
                if m != "gc" and m in best[num] and best[den].get(m)
            }
    targets = []
    for scen, figure, num, den, kind, bound in TARGETS:
        if scen == scenario:
            ratio = ratios.get(f"{num}/{den}", {})
            # the CPU ratio is the same comparison with the machine's other load taken out
            cpu_figure = "tree_cpu" if figure == "exit" else "cpu"
            target = {"ratio": f"{num}/{den}", "of": figure, "kind": kind, "bound": bound}
            target.update(value=ratio.get(figure), value_cpu=ratio.get(cpu_figure))
            target["pass"] = _verdict(ratio.get(figure), kind, bound)
            target["pass_cpu"] = _verdict(ratio.get(cpu_figure), kind, bound)
            targets.append(target)
    return {"label": plan.label(scenario), "best": best, "ratios": ratios, "targets": targets}


def _report(summary: dict[str, Any], runs: list[dict[str, Any]], repeat: int) -> str:
    lines = [
        f"ACP client benchmark: Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}, best of {repeat}; seconds.",
        "turn: prompt sent -> answered (wall); cpu: the client's CPU in the turn, gc: of which "
        "garbage collection;",
        "total: spawn -> turn end; exit: spawn -> exit; tree: CPU of client and agents, spawn "
        "-> exit.",
        "",
    ]
    names = {"turn": "turn", "cpu": "cpu", "gc": "gc", "total": "total", "exit": "exit"}
    names["tree_cpu"] = "tree"
    for scenario, s in summary.items():
        lines.append(s["label"])
        unit = "round trips/s" if scenario == "rtt" else "updates/s"
        for client in CLIENTS:
            b = s["best"].get(client)
            if b is None:
                lines.append(f"  {client:<9} -")
                continue
            cells = [f"{names[m]} {b[m]:6.2f}" for m in METRICS if m in b]
            rate = f"  {b['rate']:>9,.0f} {unit}" if "rate" in b else ""
            lines.append(f"  {client:<9} " + "  ".join(cells) + rate)
        for name, r in s["ratios"].items():
            cells = [f"{names[m]} {v:5.2f}x" for m, v in r.items()]
            lines.append(f"  {name:<9} " + "  ".join(cells))
        for tgt in s["targets"]:
            sign = "<=" if tgt["kind"] == "max" else ">="
            verdict = {True: "PASS", False: "FAIL", None: "n/a"}
            value = "-" if tgt["value"] is None else f"{tgt['value']:.2f}"
            cpu = "-" if tgt["value_cpu"] is None else f"{tgt['value_cpu']:.2f}"
            lines.append(
                f"  target {tgt['ratio']} {sign} {tgt['bound']:g}: {tgt['of']} {value} "
                f"{verdict[tgt['pass']]}   (cpu {cpu} {verdict[tgt['pass_cpu']]})"
            )
        lines.append("")
    for run in runs:
        if "error" in run:
            lines.append(f"error in {run['client']} {run['scenario']}: {run['error']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with --worker, one "ours" client process)."""
    parser = argparse.ArgumentParser(
        description="ACP client benchmark: ours vs the official Python SDK vs a bare loop"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    parser.add_argument("--flood", type=int, help="updates in the flood (default 200,000)")
    parser.add_argument("--rtt", type=int, help="round trips (default 20,000)")
    parser.add_argument("--agents", type=int, help="agents flooding at once (default 50)")
    parser.add_argument("--per-agent", type=int, help="updates per agent (default 20,000)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per client; best counts")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated")
    parser.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated")
    parser.add_argument("--output", type=Path, default=RESULTS, help="the JSON results file")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the agent")
    parser.add_argument("--agent", type=Path, default=AGENT, help=argparse.SUPPRESS)
    parser.add_argument(
        "--transcript",
        action="store_true",
        help="ours writes a wire transcript of every agent, as --transcript does",
    )
    parser.add_argument("--transcript-dir", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--scenario", choices=SCENARIOS, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=200_000, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        args.agents = args.agents or 50
        return _worker(args)

    quick = args.quick
    plan = _Plan(
        flood=args.flood or (40_000 if quick else 200_000),
        rtt=args.rtt or (4_000 if quick else 20_000),
        agents=args.agents or 50,
        per_agent=args.per_agent or (2_000 if quick else 20_000),
        python=args.python,
        agent=args.agent.resolve(),
    )
    scratch = tempfile.TemporaryDirectory(prefix="bench-transcripts-") if args.transcript else None
    if scratch is not None:
        plan.transcripts = Path(scratch.name)
    scenarios = [s for s in args.scenarios.split(",") if s]
    clients = [c for c in args.clients.split(",") if c]
    if "cli" in scenarios:
        _byte_compile_package()
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    for i in range(args.repeat):
        for scenario in scenarios:
            # alternate the order, so a drift in the machine's load favours no client
            for client in clients if i % 2 == 0 else clients[::-1]:
                print(f"[{i + 1}/{args.repeat}] {scenario} {client} ...", file=sys.stderr, end="")
                sys.stderr.flush()
                gc.collect()
                run = _run(plan, client, scenario)
                if plan.transcripts is not None:  # each run writes its own, from scratch
                    for old in plan.transcripts.iterdir():
                        old.unlink()
                shown = run.get("turn", run["exit"])
                print(" failed" if "error" in run else f" {shown:.2f}s", file=sys.stderr)
                runs.append(run)
    if scratch is not None:
        scratch.cleanup()
    summary = {scenario: _summarise(plan, runs, scenario) for scenario in scenarios}
    print(_report(summary, runs, args.repeat))
    document = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(sys.argv),
        "machine": {
            "python": sys.version,
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_before": load_before,
            "load_after": os.getloadavg(),
        },
        "plan": {
            "flood": plan.flood,
            "rtt": plan.rtt,
            "agents": plan.agents,
            "per_agent": plan.per_agent,
            "repeat": args.repeat,
            "transcript": args.transcript,
        },
        "scenarios": summary,
        "runs": runs,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    print(f"results written to {args.output}", file=sys.stderr)
    return 1 if any("error" in r for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
