"""Every command README.md and docs/**/*.md give is run, or parsed, here: the documentation cannot drift from the code.

``documented_commands()`` reads every shell command of the documents: each line of a ```bash, ```sh, ```shell or
```console block (backslash continuations joined, comments dropped, ``a && b`` as two commands, a
``for x in ...; do ... done`` loop as its body once per value; in a console block the ``$ `` lines) and every inline
code span that is a command (a program, then at least one option). A span starting with ``...`` continues the
command before it in the same file: that command, less each ``--config`` file from a folder the span names one
from (a strategy overlay replaces a strategy overlay), plus the span's arguments.

``RULES`` is the one table of what happens to each, keyed by a pattern of the command as documented:

- ``run``: the command with the small overrides its row states, in one working folder shared by this module (the
  repository's ``recipes/``, ``callbacks/``, ``scripts/`` and ``tests/`` linked in, a copy of ``docs/``), so a
  command that reads another's output (``compare runs/tiny-rmsnorm runs/tiny-bhyt``) finds it; each command runs
  once however many tests need it. Single-process ``python -m bhyt_pl`` commands run in-process
  (``bhyt_pl.cli.main``: a subprocess spends seconds importing Lightning), multi-process ones as subprocesses with
  the distributed environment removed (``tests/distributed_jobs/launch.py``);
- ``parse``: a command for a GPU, a cluster or the Hub, or one that trains for an hour: its own parser reads it
  (``fit ... --print_config``, ``study ... --dry-run``, ``bench ... --dry-run``, a tool's argparse parser), so every
  flag, value and configuration file it names exists;
- ``exempt``: with the reason; a reason "run by tests/<file>::<test>" names a test that exists.

A command no rule matches, or that two rules match, fails here, naming its file, line and text, so a command added
to the documents cannot go untested. ``python tests/test_documented_commands.py`` prints every command with what
its test does, as a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import runpy
import shlex
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL_FENCES = ("bash", "sh", "shell", "console")
GENERATED = re.compile(r"^docs/(depth_study|token_budget)/(.*/)?report\.md$")
"""Reports ``study --report-from`` writes: they quote the command their ``results.json`` recorded, as it was typed."""


# ----------------------------------------------------------------------------- reading the documents
@dataclass(frozen=True)
class Command:
    """One documented command: where it is, its text as documented (one line) and the arguments it stands for."""

    path: str
    line: int
    text: str
    argv: tuple[str, ...]
    """``text`` split as a shell would, a ``...`` span completed with the command before it."""
    line_text: str = ""
    """The whole command as one shell line: ``text``, or a ``...`` span completed (placeholders are filled in it)."""
    loop: str = ""
    """``norm=bhyt`` for the body of ``for norm in ...; do ... done`` with that value."""
    part: int = 0
    """Its place among the commands of its line when there are several (``a && b``: 1 and 2), else 0."""

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}" + "".join(f"[{x}]" for x in (self.loop, self.part) if x)


_FENCE = re.compile(r"^```(\w*)\s*$")
_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_PROGRAM = re.compile(
    r"^(?:[A-Z_]+=\S+ )*(?:\.\.\. |\.venv/bin/\S+|python3? |torchrun |bash |sbatch |lm_eval |pip |scripts/\S+)"
)
_LOOP = re.compile(r"^for (\w+) in (.+); do$")


def _without_comment(line: str) -> str:
    """``line`` up to an unquoted ``#`` that starts a word."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _and_parts(text: str) -> list[str]:
    """``a && b`` as ``[a, b]`` (``&&`` inside quotes stays)."""
    parts, start, quote = [], 0, None
    for i, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif text.startswith("&&", i):
            parts.append(text[start:i])
            start = i + 2
    parts.append(text[start:])
    return [" ".join(part.split()) for part in parts if part.strip()]


def _logical_lines(lines: list[str], first: int) -> list[tuple[int, str]]:
    """``(number of the first line, text)`` of a shell block: continuations joined, comments and blanks dropped."""
    out, pending, start = [], "", None
    for number, line in enumerate(lines, first):
        start = number if start is None else start
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        text = " ".join(_without_comment(pending + line).split())
        if text:
            out.append((start, text))
        pending, start = "", None
    return out


def _is_command(span: str) -> bool:
    """An inline span names a program and gives it an option (``python -m bhyt_pl eval`` alone names the tool)."""
    if not _PROGRAM.match(span):
        return False
    if "&&" in span or span.startswith("... "):
        return True
    words = [w for w in span.split() if not re.match(r"^[A-Z_]+=", w)][1:]
    if words[:1] == ["-m"]:
        words = words[2:]
    return any(w.startswith("-") for w in words)


def _continued(previous: tuple[str, ...], span: list[str]) -> tuple[str, ...]:
    """``... ARGS`` after ``previous``: its ``--config`` files from a folder ARGS names one from are replaced."""
    folders = {str(Path(span[i + 1]).parent) for i, arg in enumerate(span[:-1]) if arg == "--config"}
    kept: list[str] = []
    skip = False
    for i, arg in enumerate(previous):
        if skip:
            skip = False
            continue
        if arg == "--config" and i + 1 < len(previous) and str(Path(previous[i + 1]).parent) in folders:
            skip = True
            continue
        kept.append(arg)
    return (*kept, *span)


def _file_commands(path: Path) -> list[Command]:
    rel = path.relative_to(ROOT).as_posix()
    found: list[tuple[int, str, str]] = []  # (line, text, loop)
    lines = path.read_text().splitlines()
    fence, block, start = None, [], 0
    for number, line in enumerate(lines, 1):
        if fence is None and _FENCE.match(line):
            fence, block, start = _FENCE.match(line).group(1), [], number + 1
            continue
        if fence is not None and line.startswith("```"):
            if fence in SHELL_FENCES:
                found += _block_commands(block, start, console=fence == "console")
            fence = None
            continue
        if fence is not None:
            block.append(line)
            continue
        for span in _SPAN.findall(line):
            span = " ".join(span.split())
            if _is_command(span):
                found += [(number, part, "") for part in _and_parts(span)]
    commands: list[Command] = []
    for number, text, loop in found:
        argv, line_text = tuple(shlex.split(text)), text
        if argv[0] == "...":
            full = [c for c in commands if not c.text.startswith("... ")]
            assert full, f"{rel}:{number}: {text!r} continues a command, but none comes before it"
            argv = _continued(full[-1].argv, list(argv[1:]))
            line_text = shlex.join(argv)
        commands.append(Command(rel, number, text, argv, line_text, loop))
    return commands


def _block_commands(lines: list[str], first: int, console: bool) -> list[tuple[int, str, str]]:
    items = _logical_lines(lines, first)
    if console:
        items = [(number, text[2:]) for number, text in items if text.startswith("$ ")]
    out: list[tuple[int, str, str]] = []
    i = 0
    while i < len(items):
        number, text = items[i]
        loop = _LOOP.match(text)
        if loop is None:
            out += [(number, part, "") for part in _and_parts(text)]
            i += 1
            continue
        body_end = next(j for j in range(i + 1, len(items)) if items[j][1] == "done")
        for value in loop.group(2).split():
            for body_number, body in items[i + 1 : body_end]:
                body = re.sub(rf"\$\{{?{loop.group(1)}\}}?\b", value, body)
                out += [(body_number, part, f"{loop.group(1)}={value}") for part in _and_parts(body)]
        i = body_end + 1
    return out


def documented_commands() -> list[Command]:
    """Every command of README.md and docs/**/*.md, in document order."""
    commands = [command for path in DOCUMENTS for command in _file_commands(path)]
    count = Counter((c.path, c.line, c.loop) for c in commands)
    seen: Counter = Counter()
    numbered = []
    for command in commands:
        key = (command.path, command.line, command.loop)
        seen[key] += 1
        numbered.append(replace(command, part=seen[key]) if count[key] > 1 else command)
    return numbered


# ----------------------------------------------------------------------------- what happens to a command
@dataclass(frozen=True)
class Action:
    """What the test does with a command: ``kind`` run, parse or exempt; ``how`` says it in words (the printed
    table); ``do(workspace, argv, env)`` does it; ``subs`` fills the placeholders the document leaves; ``needs``
    are patterns of documented commands whose output this one reads (they run first, once)."""

    kind: str
    how: str
    do: Callable[[Workspace, list[str], dict[str, str]], Any] | None = None
    subs: dict[str, str] = field(default_factory=dict)
    needs: tuple[str, ...] = ()


SMALL = ("--trainer.max_steps", "2", "--trainer.limit_val_batches", "1", "--data.init_args.seq_len", "64",
         "--data.init_args.batch_size", "2", "--trainer.enable_progress_bar", "false")  # fmt: skip
"""A tiny fit's overrides: two optimizer steps of 2 x 64 tokens, one validation batch."""
ON_2_CPUS = (
    "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.precision", "32-true",
    "--trainer.accumulate_grad_batches", "1", "--model.preset", "tiny", "--data.init_args.data_files", "embedded",
    "--data.init_args.tokenizer", "embedded", "--data.init_args.num_workers", "0", "--runs_dir", "runs-2cpu",
    *SMALL[:2], *SMALL[4:],
)  # fmt: skip
"""An 8-GPU recipe on 2 CPU processes: the `tiny` model on the embedded corpus, float32, two steps, validated at the
recipe's own ``limit_val_batches`` (the evaluation set is split evenly across the ranks, so neither waits on the
other in FSDP2's collectives)."""
BHYT_PL = ("python", "-m", "bhyt_pl")


def _program(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """The environment assignments before a command, and the command with ``.venv/bin/`` dropped."""
    env = {}
    while argv and re.match(r"^[A-Z_]+=", argv[0]):
        name, _, value = argv.pop(0).partition("=")
        env[name] = value
    if argv and argv[0].startswith(".venv/bin/"):
        argv[0] = argv[0].removeprefix(".venv/bin/")
    return env, argv


def _tool_argv(argv: list[str]) -> list[str]:
    assert tuple(argv[:3]) == BHYT_PL, f"not a python -m bhyt_pl command: {shlex.join(argv)}"
    return argv[3:]


def _cli(argv: list[str]) -> Any:
    """``python -m bhyt_pl ARGV`` in this process; an exit status of 0 (``--help``, ``--print_config``) is a result."""
    from bhyt_pl.cli import main

    try:
        result = main(argv)
    except SystemExit as exit_:
        assert exit_.code in (0, None), f"exit status {exit_.code}: {shlex.join(argv)}"
        return 0
    assert not isinstance(result, int) or result == 0, f"exit status {result}: {shlex.join(argv)}"
    return result


def run_here(*overrides: str, check: Callable[[Any, list[str]], None] | None = None) -> Callable:
    """Run a ``python -m bhyt_pl`` command in this process, with ``overrides`` after its own arguments."""

    def do(workspace: Workspace, argv: list[str], env: dict[str, str]) -> Any:
        args = [*_tool_argv(argv), *overrides]
        with workspace.inside(env):
            result = _cli(args)
            if args[0] == "fit" and "--print_config" not in args and "--help" not in args:
                steps = int(args[len(args) - 1 - args[::-1].index("--trainer.max_steps") + 1])
                assert result.trainer.global_step == steps, f"fit stopped at {result.trainer.global_step}: {args}"
            if args[0] in ("validate", "test"):
                assert f"{'val' if args[0] == 'validate' else 'test'}/loss" in result.trainer.callback_metrics
            if check is not None:
                check(result, args)
        return result

    return do


def run_processes(*overrides: str) -> Callable:
    """Run a multi-process ``python -m bhyt_pl fit`` as a subprocess (its ranks are its own subprocesses)."""

    def do(workspace: Workspace, argv: list[str], env: dict[str, str]) -> None:
        from distributed_jobs.launch import clean_env

        args = [sys.executable, "-m", "bhyt_pl", *_tool_argv(argv), *overrides]
        proc = subprocess.run(args, cwd=workspace.root, env={**clean_env(), **env}, capture_output=True, text=True,
                              timeout=900)  # fmt: skip
        assert proc.returncode == 0, f"{shlex.join(args)}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        assert "finished at step 2;" in proc.stdout + proc.stderr

    return do


def parse_fit(workspace: Workspace, argv: list[str], env: dict[str, str]) -> dict:
    """``fit ... --print_config``: jsonargparse reads every ``--config`` file, flag and value, instantiating nothing."""
    out = io.StringIO()
    with workspace.inside(env), contextlib.redirect_stdout(out):
        _cli([*_tool_argv(argv), "--print_config"])
    return yaml.safe_load(out.getvalue())


class _Parsed(Exception):
    """Raised by ``argparse`` once a command line is parsed, to stop before the command does any work."""

    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__("parsed")
        self.namespace = namespace


def parsed_by_argparse(call: Callable[[], Any], argv0: str, args: list[str]) -> argparse.Namespace:
    """The namespace the argparse parser of ``call`` (a tool's or a script's ``main``) makes of ``args``, without
    running the rest of ``call``: an unknown option or a bad value exits with argparse's status 2."""

    def stopping(parse_args: Callable[..., argparse.Namespace]) -> Callable[..., argparse.Namespace]:
        def stop_after_parsing(self: argparse.ArgumentParser, *given: Any, **kwargs: Any) -> argparse.Namespace:
            raise _Parsed(parse_args(self, *given, **kwargs))

        return stop_after_parsing

    def parsers(cls: type) -> Iterator[type]:  # argparse's class and every subclass with a parse_args of its own
        yield cls
        for sub in cls.__subclasses__():
            yield from parsers(sub)

    import bhyt_pl.study.cli.arguments  # noqa: F401  (the study's parser class loads lazily: defined now, patched below)

    with pytest.MonkeyPatch.context() as patch:
        for cls in parsers(argparse.ArgumentParser):
            if "parse_args" in vars(cls):
                patch.setattr(cls, "parse_args", stopping(vars(cls)["parse_args"]))
        patch.setattr(sys, "argv", [argv0, *args])
        try:
            call()
        except _Parsed as parsed:
            return parsed.namespace
        except SystemExit as exit_:
            raise AssertionError(f"{argv0} {shlex.join(args)}: exit status {exit_.code}") from None
    raise AssertionError(f"{argv0} {shlex.join(args)}: finished without parsing a command line")


def parse_tool(workspace: Workspace, argv: list[str], env: dict[str, str]) -> argparse.Namespace:
    """A ``python -m bhyt_pl <tool>`` command through the tool's argparse parser."""
    from bhyt_pl.cli import main

    args = _tool_argv(argv)
    with workspace.inside(env):
        return parsed_by_argparse(lambda: main(args), "bhyt_pl", args)


def parse_module(workspace: Workspace, argv: list[str], env: dict[str, str]) -> argparse.Namespace:
    """``python -m MODULE ARGS`` (or an entry point, ``lm_eval ARGS``) through its parser: its ``main`` reads
    ``sys.argv``."""
    import importlib

    if argv[0] == "lm_eval":  # the console script of lm-eval's own command line
        module, args, function = "lm_eval.__main__", argv[1:], "cli_evaluate"
    else:
        assert argv[:2] == ["python", "-m"], argv
        module, args, function = argv[2], argv[3:], "main"
    main = getattr(importlib.import_module(module), function)
    with workspace.inside(env):
        namespace = parsed_by_argparse(main, module, args)
    if getattr(namespace, "model", None) is not None:  # lm-eval: the model is registered (bhyt_pl's by its import)
        import lm_eval.models  # noqa: F401  (registers lm-eval's own models, as its command line does)
        from lm_eval.api.registry import get_model

        import bhyt_pl.eval.lm  # noqa: F401

        get_model(namespace.model)
    return namespace


def parse_script(workspace: Workspace, argv: list[str], env: dict[str, str]) -> argparse.Namespace:
    """``python SCRIPT ARGS`` through the script's argparse parser."""
    assert argv[0] == "python", argv
    script = workspace.root / argv[1]
    assert script.is_file(), f"{argv[1]} does not exist"
    with workspace.inside(env):
        return parsed_by_argparse(lambda: runpy.run_path(str(script), run_name="__main__"), str(script), argv[2:])


def parse_torchrun(workspace: Workspace, argv: list[str], env: dict[str, str]) -> argparse.Namespace:
    """``torchrun OPTIONS SCRIPT ARGS``: torchrun's own parser, then the script's."""
    from torch.distributed.run import get_args_parser

    launch = get_args_parser().parse_args(argv[1:])
    return parse_script(workspace, ["python", launch.training_script, *launch.training_script_args], env)


def with_appended(*extra: str) -> Callable:
    """A documented command with ``extra`` arguments that make it a check (``--dry-run``, ``--plan-only``), in this
    process."""
    return run_here(*extra)


def run_gpu_bench_dry_run(workspace: Workspace, argv: list[str], env: dict[str, str]) -> None:
    """``python -m bhyt_pl.bench.gpu --dry-run``: the GPU benchmark's settings, printed without a GPU."""
    from bhyt_pl.bench import gpu

    with workspace.inside(env), contextlib.redirect_stdout(io.StringIO()):
        assert gpu.main(argv[3:]) == 0


def parse_pip_install(workspace: Workspace, argv: list[str], env: dict[str, str]) -> None:
    """``pip install -e .[EXTRA,...]``: the target is this checkout and every extra is declared in pyproject.toml."""
    import tomllib

    target = argv[argv.index("-e") + 1]
    path, _, extras = target.partition("[")
    assert path == ".", f"pip install -e {target!r}: not this checkout"
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = {e for e in extras.rstrip("]").split(",") if e}
    assert named <= declared, f"{target}: extras {sorted(named - declared)} are not among {sorted(declared)}"


def parse_study(workspace: Workspace, argv: list[str], env: dict[str, str]) -> None:
    """``study ARGS`` resolved as a run would be (``bhyt_pl.study.cli.exploration.prepare``: options, config files, the
    budget, the schemes, the data), without the launcher's check for GPUs or SLURM's tools, and without a run."""
    from bhyt_pl.study.cli.exploration import prepare

    with workspace.inside(env):
        prepare(_tool_argv(argv)[1:])


def _script_defaults(text: str) -> list[str]:
    """The arguments a launcher script passes when it is given none (its ``set -- ...``)."""
    found = re.search(r"^\s*set -- (.*?)\n\s*fi$", text.replace("\\\n", " "), re.M | re.S)
    return shlex.split(found.group(1)) if found else []


def parse_launcher_script(workspace: Workspace, argv: list[str], env: dict[str, str]) -> None:
    """``sbatch [OPTIONS] slurm.sbatch ARGS`` or ``bash torchrun.sh ARGS``: the script's shell syntax (``bash -n``),
    then the ``fit`` it launches, with the node and process counts it adds (``--trainer.num_nodes``,
    ``--trainer.devices``), through ``fit --print_config``."""
    at = next(i for i, arg in enumerate(argv) if arg.endswith((".sbatch", ".sh")))
    script = workspace.root / argv[at]
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    args = argv[at + 1 :] or _script_defaults(text)
    if script.suffix == ".sbatch":
        options = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, re.M))
        options |= dict(arg.removeprefix("--").split("=", 1) for arg in argv[1:at] if arg.startswith("--"))
        nodes, devices = options["nodes"], options["ntasks-per-node"]
    else:
        nodes, devices = env.get("NNODES", "4"), env.get("NPROC_PER_NODE", "8")
    config = parse_fit(workspace, [*BHYT_PL, "fit", *args, "--trainer.num_nodes", nodes, "--trainer.devices",
                                   devices], {})  # fmt: skip
    assert (str(config["trainer"]["num_nodes"]), str(config["trainer"]["devices"])) == (nodes, devices)


def parse_gpu_bench(workspace: Workspace, argv: list[str], env: dict[str, str]) -> None:
    """``scripts/gpu_bench.sh``: its shell syntax, then each benchmark it starts (``"$PY" -m MODULE ARGS``) through
    that benchmark's ``--dry-run`` (its settings resolved; no GPU needed)."""
    from bhyt_pl.bench import gpu
    from bhyt_pl.cli import main

    script = workspace.root / argv[0]
    subprocess.run(["bash", "-n", str(script)], check=True)
    runs = re.findall(r'"\$PY" -m (\S+) (.*?)(?: \|\| rc=\$\?)?$', script.read_text().replace("\\\n", " "), re.M)
    assert [module for module, _ in runs] == ["bhyt_pl", "bhyt_pl.bench.gpu", "bhyt_pl"], runs
    with workspace.inside(env), contextlib.redirect_stdout(io.StringIO()):
        for module, args in runs:
            args = [a for a in shlex.split(args) if a != "$@"]
            assert (main(args + ["--dry-run"]) if module == "bhyt_pl" else gpu.main(args + ["--dry-run"])) == 0


def consolidated(result: Any, args: list[str]) -> None:
    from bhyt_pl import load_model

    assert load_model(args[-1]).config.n_layers > 0  # one file that loads


def exported(result: Any, args: list[str]) -> None:
    out = Path(args[args.index("--out") + 1])
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()


def compared(result: Any, args: list[str]) -> None:
    out = Path(args[args.index("--out") + 1]) if "--out" in args else Path("compare.png")
    assert out.is_file() and out.with_suffix(".md").is_file()


QUICK_START = r"^\.venv/bin/python -m bhyt_pl fit --config recipes/tiny\.yaml$"
TINY_BHYT = r"^\.venv/bin/python -m bhyt_pl fit --config recipes/tiny\.yaml --model\.norm bhyt$"
FSDP2_8GPU = r"^\.\.\. --config recipes/distributed/fsdp2-8gpu\.yaml$"
COMPARE_EXAMPLE = r"--runs_dir runs/compare-example "
FIT_PARSE = Action("parse", "fit ... --print_config, <norm> bhyt (GPUs, the Hub's C4 or LIMA, pretrained checkpoints)",
                   parse_fit, {"<norm>": "bhyt"})  # fmt: skip
BENCH_PARSE = Action(
    "parse",
    "bench ... --dry-run (a timing of minutes to hours; the parts run at small sizes in tests/bench/)",
    with_appended("--dry-run"),
    {"$(mktemp -d)": "inductor-cache"},
)
STUDY_DRY_RUN = Action(
    "parse",
    "study ... --dry-run --probe-steps 0 (an hour or more of training; the study runs small in tests/study/)",
    with_appended("--dry-run", "--probe-steps", "0"),
    {"DIR": "docs/depth_study"},
)
PLAN_ONLY = Action(
    "parse",
    "study confirm ... --plan-only on the committed pilot (46 runs; the confirmation runs small in tests/study/)",
    with_appended("--plan-only"),
    {"DIR": "docs/depth_study"},
)

RULES: list[tuple[str, Action]] = [
    # set-up, the suite, servers
    (r"^python3 -m venv \.venv$", Action("exempt", "creates the environment this suite runs in")),
    (r"^\.venv/bin/pip install -e ", Action(
        "parse", "every extra it names is one of pyproject.toml's (installing is the suite's own set-up)",
        parse_pip_install)),
    (r"^\.venv/bin/pip install (?!-e )", Action(
        "exempt", "installs packages: the suite runs in an installed environment")),
    (r"^\.venv/bin/python -m pytest( |$)", Action("exempt", "the test suite itself")),
    (r"^\.venv/bin/ruff check ", Action("exempt", "the linter: .ci/run runs it beside this suite")),
    (r"^bash \.ci/run$", Action("exempt", "CI: installs a clean clone, lints, runs this suite")),
    (r"^\.venv/bin/mkdocs build --strict$", Action("exempt", "builds the documentation site: .ci/run runs it")),
    (r"^\.venv/bin/(tensorboard --logdir|mlflow ui) ", Action("exempt", "a web server that runs until stopped")),
    # training on the CPU
    (QUICK_START, Action("run", " ".join(SMALL), run_here(*SMALL))),
    (TINY_BHYT, Action("run", " ".join(SMALL), run_here(*SMALL))),
    (r"--config recipes/tiny/ngpt\.yaml$", Action("run", " ".join(SMALL), run_here(*SMALL))),
    (r"--model\.norm_args '\{lambda_attn: 1\.0\}'$", Action("run", " ".join(SMALL), run_here(*SMALL))),
    (r"fit --config recipes/tiny\.yaml --print_config$", Action("run", "as documented", run_here())),
    (r"^\.venv/bin/python -m bhyt_pl fit --help$", Action("run", "as documented", run_here())),
    (r"fit --config recipes/tiny\.yaml --ckpt_path last$", Action(
        "run", f"{' '.join(SMALL)} --trainer.max_steps 3: one step past the quick start's run it resumes",
        run_here(*SMALL, "--trainer.max_steps", "3"), needs=(QUICK_START,))),
    (r"^\.venv/bin/python -m bhyt_pl validate --config recipes/tiny\.yaml --ckpt_path last$", Action(
        "run", "--trainer.limit_val_batches 1 (and the data of SMALL), on the quick start's run",
        run_here(*SMALL[2:]), needs=(QUICK_START,))),
    (r"^\.venv/bin/python -m bhyt_pl test --config recipes/tiny\.yaml --ckpt_path last$", Action(
        "run", "--trainer.limit_test_batches 1 (and the data of SMALL), on the quick start's run",
        run_here("--trainer.limit_test_batches", "1", *SMALL[4:]), needs=(QUICK_START,))),
    (r"--config recipes/tiny\.yaml --config callbacks/paper\.yaml$", Action("run", " ".join(SMALL), run_here(*SMALL))),
    (r"^WANDB_MODE=offline .*--config recipes/loggers/csv\.yaml$", Action(
        "run", f"{' '.join(SMALL)}; WANDB_MODE=offline as documented", run_here(*SMALL))),
    (r"--model\.norm ngpt --model\.lr LR --seed_everything S$", Action(
        "run", f"LR 3e-2, S 1; {' '.join(SMALL)}", run_here(*SMALL), {"LR": "3e-2", "S": "1"})),
    (COMPARE_EXAMPLE, Action("run", f"{' '.join(SMALL)} (after the documented --trainer.max_steps 40)",
                             run_here(*SMALL))),
    # comparing, evaluating, exporting what those runs wrote
    (r"compare runs/tiny-rmsnorm runs/tiny-bhyt --out compare\.png$", Action(
        "run", "as documented, on the quick start's run and the `--model.norm bhyt` one", run_here(check=compared),
        needs=(QUICK_START, TINY_BHYT))),
    (r"compare docs/depth_study/results\.json ", Action("run", "as documented", run_here(check=compared))),
    (r"compare runs/compare-example/tiny-rmsnorm runs/compare-example/tiny-bhyt ", Action(
        "run", "as documented, on the two runs of the loop above", run_here(check=compared),
        needs=(COMPARE_EXAMPLE,))),
    (r"eval --ckpt_path runs/tiny-bhyt/version_0/checkpoints/last\.ckpt --include_path embedded$", Action(
        "run", "--limit 1 --bootstrap_iters 0, on the `--model.norm bhyt` run's checkpoint",
        run_here("--limit", "1", "--bootstrap_iters", "0"), needs=(TINY_BHYT,))),
    (r"export --ckpt_path runs/tiny-bhyt/version_0/checkpoints/last\.ckpt --out tiny-bhyt-hf$", Action(
        "run", "as documented, on the `--model.norm bhyt` run's checkpoint", run_here(check=exported),
        needs=(TINY_BHYT,))),
    (r"eval --ckpt_path (runs/llama-1b|X\.ckpt|runs/lima-1b)", Action(
        "parse", "eval's parser (a GPU, the Hub's tasks, or checkpoints of GPU runs)", parse_tool)),
    (r"(^\.venv/bin/lm_eval |-m bhyt_pl\.eval\.harness )", Action(
        "parse", "lm-eval's parser, and its --model is registered (the Hub's tasks)", parse_module)),
    # the paper's runs (GPUs, the Hub's C4)
    (r"fit --config recipes/pretrain/llama-\w+\.yaml --config recipes/norms/<norm>\.yaml$|"
     r"^\.\.\. --config recipes/norms/bhyt_(paper_lambda|exact)\.yaml$|"
     r"(fit|^\.\.\.) --config recipes/sft/lima-1b\.yaml ", FIT_PARSE),
    # distributed
    (r"fit --config recipes/pretrain/llama-1b\.yaml --config recipes/norms/bhyt\.yaml --config "
     r"recipes/distributed/ddp-8gpu\.yaml$", Action(
        "run", f"2 CPU processes: {' '.join(ON_2_CPUS)} --run_name ddp-8gpu",
        run_processes(*ON_2_CPUS, "--run_name", "ddp-8gpu"))),
    (FSDP2_8GPU, Action(
        "run", f"2 CPU processes: {' '.join(ON_2_CPUS)} --trainer.strategy.init_args.data_parallel_size 2 "
        "--run_name fsdp2-8gpu",
        run_processes(*ON_2_CPUS, "--trainer.strategy.init_args.data_parallel_size", "2", "--run_name",
                      "fsdp2-8gpu"))),
    (r"^\.\.\. --config recipes/distributed/fsdp1-8gpu\.yaml$", Action(
        "parse", "fit ... --print_config (FSDP1 refuses the CPU)", parse_fit)),
    (r"fit --config recipes/tiny\.yaml --config recipes/distributed/fsdp2-cpu\.yaml$", Action(
        "exempt", "run by tests/test_distributed.py::test_the_readme_two_process_rehearsal_validates_and_finishes "
        "(this recipe stack with --trainer.max_steps 4 --trainer.val_check_interval 2, validating at steps 2 and 4; "
        "tests/test_distributed_checkpoints.py kills and resumes it)")),
    (r"^sbatch .*recipes/distributed/slurm\.sbatch", Action(
        "parse", "bash -n, then the fit it launches through fit --print_config (SLURM)", parse_launcher_script)),
    (r"bash recipes/distributed/torchrun\.sh ", Action(
        "parse", "bash -n, then the fit it launches through fit --print_config (several nodes; "
        "tests/test_multinode.py runs the script on 2 local 'nodes')", parse_launcher_script)),
    (r"-m bhyt_pl consolidate runs/llama-3b-bhyt/version_0/checkpoints/last\.ckpt llama-3b-bhyt\.ckpt$", Action(
        "run", "on the sharded last.ckpt of the FSDP2 8-GPU recipe's run on 2 CPU processes",
        run_here(check=consolidated), {"runs/llama-3b-bhyt/": "runs-2cpu/fsdp2-8gpu/"}, needs=(FSDP2_8GPU,))),
    (r"^\.venv/bin/torchrun --standalone --nproc_per_node (N|\$\(nvidia-smi -L \| wc -l\)) "
     r"scripts/gpu_distributed_check\.py$", Action(
        "parse", "torchrun's parser, then the script's (CUDA GPUs)", parse_torchrun,
        {"$(nvidia-smi -L | wc -l)": "8", "N": "8"})),
    # benchmarks
    (r"(^|\s)\.venv/bin/python -m bhyt_pl bench( |$)|^\.\.\. --schemes rmsnorm bhyt bhyt_exact dyt ", BENCH_PARSE),
    (r"^\.venv/bin/python -m bhyt_pl\.bench\.gpu --dry-run$", Action("run", "as documented", run_gpu_bench_dry_run)),
    (r"^scripts/gpu_bench\.sh$", Action("parse", "bash -n, then each benchmark it starts with --dry-run (CUDA)",
                                        parse_gpu_bench)),
    (r"^\.venv/bin/python tests/callbacks/bench_stability_overhead\.py ", Action(
        "parse", "the script's parser (a timing of minutes)", parse_script)),
    (r"^\.venv/bin/python -m bhyt_pl\.data\.build_assets$", Action(
        "parse", "its parser (it rebuilds bhyt_pl/data/assets from sources it downloads)", parse_module)),
    # the depth study
    (r"bhyt_pl study (--quick --workers 2|--workers 2|--schemes |--sweep --quick|--workers 2 --out )", STUDY_DRY_RUN),
    (r"bhyt_pl study --preset llama-374m .* --accelerator gpu ", Action(
        "parse", "the study's setup, as a run resolves it (a GPU)", parse_study)),
    (r"bhyt_pl study --config recipes/study/gpu-node\.yaml$", Action(
        "parse", "the study's setup, as a run resolves it (8 GPUs)", parse_study)),
    (r"bhyt_pl study --config recipes/study/slurm\.yaml --dry-run$", Action("run", "as documented", run_here())),
    (r"bhyt_pl study --config recipes/study/slurm\.yaml --partition ", Action(
        "parse", "study ... --dry-run --probe-steps 0 (SLURM)", with_appended("--dry-run", "--probe-steps", "0"))),
    (r"bhyt_pl study --dry-run --workers 2$", Action(
        "run", "--probe-steps 1 --no-compile (the probe: a warm-up step and one timed step, eager)",
        run_here("--probe-steps", "1", "--no-compile"))),
    (r"bhyt_pl study --report-from docs/depth_study$", Action(
        "parse", "the study's parser; report_from, on a copy (the command rewrites docs/depth_study), is run by "
        "tests/study/test_report_exploration.py::test_the_committed_report_rebuilds_from_its_record_byte_for_byte",
        parse_tool)),
    (r"study confirm --pilot DIR --max-seeds 13 --plan-only$", Action(
        "run", "DIR docs/depth_study, the committed pilot (writes nothing)", run_here(), {"DIR": "docs/depth_study"})),
    (r"study confirm --pilot (DIR|docs/depth_study)( --max-seeds 13( --workers 2)?)?$", PLAN_ONLY),
    (r"study --report-from DIR/confirmation$", Action(
        "parse", "the study's parser; the confirmation's report is rebuilt from a copy of its record by "
        "tests/study/test_report_confirmation.py", parse_tool, {"DIR": "docs/depth_study"})),
    (r"study confirm --pilot runs/study-374m --launcher slurm ", Action(
        "parse", "the confirmation's parser (a pilot of the SLURM study)", parse_tool)),
    # the token-budget map
    (r"bhyt_pl study token-budget (--workers 2 --out docs/token_budget|--dry-run --workers 2)$", Action(
        "parse", "study token-budget ... --dry-run --probe-steps 0 (about 80 minutes of training; the map runs small "
        "in tests/study/test_cli_token_budget.py)", with_appended("--dry-run", "--probe-steps", "0"))),
    (r"bhyt_pl study token-budget --config recipes/study/token-budget-374m\.yaml --dry-run$", Action(
        "run", "as documented", run_here())),
    (r"bhyt_pl study --report-from docs/token_budget$", Action(
        "parse", "the study's parser; the map's report is rebuilt from a copy of its record by "
        "tests/study/test_documented_map.py", parse_tool)),
]  # fmt: skip
"""The one table: a pattern searched in the command as documented, and what its test does."""


def classify(command: Command) -> Action:
    """The one rule of ``RULES`` whose pattern the command's documented text matches; fails naming it otherwise."""
    matches = [(pattern, action) for pattern, action in RULES if re.search(pattern, command.text)]
    if len(matches) != 1:
        why = "no rule of RULES matches it" if not matches else f"rules {[p for p, _ in matches]} all match it"
        pytest.fail(f"{command.id}: {why}; add one to tests/test_documented_commands.py: {command.text}", False)
    return matches[0][1]


def resolved(command: Command, action: Action) -> list[str]:
    """The command's arguments with the document's placeholders filled in (``Action.subs``)."""
    text = command.line_text
    for placeholder, value in action.subs.items():
        if re.fullmatch(r"\w+", placeholder):
            text = re.sub(rf"(?<![\w./-]){placeholder}\b", value, text)
        else:
            text = text.replace(placeholder, value)
    return shlex.split(text)


# ----------------------------------------------------------------------------- where they run
class Workspace:
    """The folder every command runs in (its working directory), and the commands run so far."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[tuple[str, ...], Any] = {}
        self.failed: dict[tuple[str, ...], str] = {}

    @contextlib.contextmanager
    def inside(self, env: dict[str, str]):
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(self.root)
            patch.setenv("MPLBACKEND", "Agg")
            for name, value in env.items():
                patch.setenv(name, value)
            yield

    def execute(self, command: Command) -> Any:
        """Do what ``RULES`` says for ``command``, once: after the commands it needs, and not again for the same
        command line documented elsewhere."""
        action = classify(command)
        argv = resolved(command, action)
        key = tuple(argv)
        if key in self.failed:
            pytest.fail(f"{command.id} failed before (another test needed it): {self.failed[key]}", False)
        if key in self.done:
            return self.done[key]
        for pattern in action.needs:
            for needed in _needed(pattern):
                self.execute(needed)
        env, program = _program(list(argv))
        try:
            self.done[key] = action.do(self, program, env)
        except BaseException as err:
            self.failed[key] = f"{type(err).__name__}: {str(err)[:300]}"
            raise
        return self.done[key]


def _needed(pattern: str) -> list[Command]:
    """The documented commands a rule's ``needs`` pattern names (the loop's: one per value)."""
    found = [command for command in COMMANDS if re.search(pattern, command.text)]
    assert found, f"no documented command matches {pattern!r}, which a rule needs"
    return found


COMMANDS = documented_commands()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    root = tmp_path_factory.mktemp("documented")
    for name in ("recipes", "callbacks", "scripts", "tests"):
        (root / name).symlink_to(ROOT / name)
    shutil.copytree(ROOT / "docs", root / "docs")  # read, never written: a command writing there writes a copy
    return Workspace(root)


# ----------------------------------------------------------------------------- the tests
def test_the_documents_give_commands_and_the_reader_finds_each_kind() -> None:
    """The reader sees what a reader would: block lines, continuations, ``&&``, the loop, inline commands, ``...``."""
    assert len(COMMANDS) > 80, "README.md and docs/ lost their commands, or the reader stopped finding them"
    first_block = (ROOT / "README.md").read_text().splitlines().index("```bash") + 2  # the quick start's first line
    quick = [c for c in COMMANDS if c.path == "README.md" and c.line == first_block]
    assert [(c.text.split()[0], c.part) for c in quick] == [("python3", 1), (".venv/bin/pip", 2),
                                                            (".venv/bin/python", 3)]  # fmt: skip
    assert re.search(QUICK_START, quick[2].text) and quick[2].id == f"README.md:{first_block}[3]"
    loop = [c for c in COMMANDS if c.loop]
    assert [c.loop for c in loop] == ["norm=rmsnorm", "norm=bhyt"]
    assert all("--model.norm " + c.loop.split("=")[1] + " " in c.text and "\\" not in c.text for c in loop)
    fsdp2 = next(c for c in COMMANDS if re.search(FSDP2_8GPU, c.text))
    assert fsdp2.argv[3:] == ("fit", "--config", "recipes/pretrain/llama-1b.yaml", "--config",
                              "recipes/norms/bhyt.yaml", "--config", "recipes/distributed/fsdp2-8gpu.yaml")  # fmt: skip
    assert _continued(("bench", "--parts", "x", "--schemes", "a"), ["--schemes", "b"]) == (
        "bench", "--parts", "x", "--schemes", "a", "--schemes", "b")  # fmt: skip
    assert _logical_lines(["a \\", "  b  # note", "", "# only a comment", "c '#x'"], 7) == [(7, "a b"), (11, "c '#x'")]
    assert _block_commands(["$ python -m x --y", "output line"], 1, console=True) == [(1, "python -m x --y", "")]


def test_every_documented_command_has_exactly_one_rule() -> None:
    unclassified = []
    for command in COMMANDS:
        matches = [pattern for pattern, _ in RULES if re.search(pattern, command.text)]
        if len(matches) != 1:
            unclassified.append(f"{command.id}: {command.text} (rules: {matches or 'none'})")
    assert not unclassified, "commands without exactly one rule in RULES:\n" + "\n".join(unclassified)
    used = {pattern for pattern, _ in RULES if any(re.search(pattern, c.text) for c in COMMANDS)}
    assert used == {pattern for pattern, _ in RULES}, f"rules no command matches: {set(p for p, _ in RULES) - used}"
    for _, action in RULES:
        for test in re.findall(r"run by (tests/\S+?\.py)::(test_\w+)", action.how):
            assert f"def {test[1]}(" in (ROOT / test[0]).read_text(), f"{test[0]}::{test[1]} does not exist"


def test_every_command_runs_after_the_quick_start_as_written() -> None:
    """After the quick start only ``.venv/bin/`` has bhyt_pl and its tools: ``python -m bhyt_pl compare ...``
    failed with ``No module named 'torch'``. Reports ``study --report-from`` writes quote the command their
    ``results.json`` recorded."""
    bare = []
    for command in COMMANDS:
        program = re.sub(r"^([A-Z_]+=(\$\([^)]*\)|\S+) )*", "", command.text)
        allowed = re.match(r"^(\.venv/bin/|bash |sbatch |\.\.\. |scripts/|python3 -m venv )", program)
        if not allowed and not GENERATED.match(command.path):
            bare.append(f"{command.id}: {command.text}")
    assert not bare, "commands that need an activated environment:\n" + "\n".join(bare)


def _params() -> list[Any]:
    params = []
    for command in COMMANDS:
        matches = [a for p, a in RULES if re.search(p, command.text)]
        kind = matches[0].kind if len(matches) == 1 else "unclassified"
        marks = [pytest.mark.slow] if kind == "run" else []
        if kind == "run" and matches[0].do.__qualname__.startswith("run_processes"):
            marks.append(pytest.mark.distributed)
        params.append(pytest.param(command, id=command.id, marks=marks))
    return params


@pytest.mark.parametrize("command", _params())
def test_documented_command(command: Command, workspace: Workspace) -> None:
    action = classify(command)
    if action.kind == "exempt":
        return  # the reason is in the table; test_every_documented_command_has_exactly_one_rule checks pointers
    workspace.execute(command)


def table() -> str:
    """Every documented command and what its test does, as a markdown table."""
    rows = ["| where | command | test | how |", "|---|---|---|---|"]
    for command in COMMANDS:
        matches = [a for p, a in RULES if re.search(p, command.text)]
        kind, how = (matches[0].kind, matches[0].how) if len(matches) == 1 else ("unclassified", "")
        text = command.text.replace("|", "\\|")  # a pipe inside a cell ends it
        rows.append(f"| {command.id} | `{text}` | {kind} | {how} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(table())
