"""A fake SLURM for tests: ``sbatch``, ``sacct``, ``srun``, ``scancel`` and ``scontrol`` that run jobs on this machine.

The executables beside this file call ``python cluster.py <tool> ARGS``. They print what SLURM prints, as far
as submitit reads it, and keep their state in ``$FAKE_SLURM_DIR/state.json`` (under a lock):

- ``sbatch SCRIPT`` reads the ``#SBATCH`` lines, prints ``Submitted batch job N`` and starts a detached runner
  that executes the script with ``bash`` once per array task (``--array=0-4%2``: tasks 0..4, at most 2 at
  once), with ``SLURM_JOB_ID``, ``SLURM_ARRAY_JOB_ID``, ``SLURM_ARRAY_TASK_ID``, ``SLURM_CPUS_PER_TASK``,
  ``SLURM_RESTART_COUNT``, ... set, and its output in ``--output``/``--error`` with ``%A``, ``%a``, ``%j``
  expanded. Every call is logged to ``sbatch.log`` (its options, and a copy of the script in ``scripts/``).
  ``FAKE_SLURM_HOLD=1`` in sbatch's environment queues the job without ever running it.
- ``srun [OPTIONS] COMMAND`` records the step's process id and runs the command in its place, its output in
  ``--output``/``--error`` (``%A``, ``%a``, ``%j``, ``%t`` expanded).
- ``sacct -o FIELDS --parsable2 -j ID ...`` prints ``FIELD|FIELD`` lines: one per started task (and its
  ``.batch`` step), pending tasks of an array in SLURM's compact form (``1000_[2-4%2]``), ``CANCELLED by
  <uid>`` for a cancelled task; a task whose accounting was dropped (``FakeSlurm.forget``) is left out.
- ``scancel ID ...`` cancels (SIGTERM to the task's processes, SIGKILL a second later);
  ``scancel ID --signal SIG`` sends SIG to the running step. Calls are logged to ``scancel.log``.
- ``scontrol requeue ID`` marks a running task: when its process ends, it runs again (``SLURM_RESTART_COUNT``
  one higher) instead of ending.

Tasks run in their own session; ``FakeSlurm.kill_all`` ends every process the fake started.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BIN = Path(__file__).resolve().parent
FINAL = {"COMPLETED", "FAILED", "CANCELLED"}


# ----------------------------------------------------------------------------- state
def _dir() -> Path:
    return Path(os.environ["FAKE_SLURM_DIR"])


@contextlib.contextmanager
def _state(folder: Path | None = None) -> Iterator[dict[str, Any]]:
    """The state, locked; written back (atomically) when the block ends."""
    folder = folder or _dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = folder / "state.json"
        state = json.loads(path.read_text()) if path.exists() else {"next_id": 1000, "tasks": {}}
        yield state
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(path)


def _matches(task: dict[str, Any], job_id: str) -> bool:
    """``1000`` names a whole array (or a plain job), ``1000_3`` one task."""
    return task["key"] == job_id or (task["array"] is not None and task["array"] == job_id)


def _log(name: str, entry: dict[str, Any]) -> None:
    with open(_dir() / name, "a") as f:
        f.write(json.dumps(entry) + "\n")


def _expand(pattern: str, env: dict[str, str]) -> str:
    """SLURM's filename patterns: %A array job, %a task index, %j job id, %t task rank, %% a percent sign."""
    values = {
        "A": env.get("SLURM_ARRAY_JOB_ID", env["SLURM_JOB_ID"]),
        "a": env.get("SLURM_ARRAY_TASK_ID", "4294967294"),
        "j": env["SLURM_JOB_ID"],
        "t": "0",
        "%": "%",
    }
    return re.sub(r"%([Aajt%])", lambda m: values[m.group(1)], pattern)


# ----------------------------------------------------------------------------- sbatch
def sbatch(args: list[str]) -> int:
    script = Path(args[-1]).resolve()
    options: dict[str, str] = {}
    for line in script.read_text().splitlines():
        if line.startswith("#SBATCH"):
            flag = shlex.split(line[len("#SBATCH") :])[0]
            key, _, value = flag.lstrip("-").partition("=")
            options[key] = value if value else "true"
    indices: list[int | None] = [None]
    throttle = 1
    if "array" in options:
        spec, _, limit = options["array"].partition("%")
        first, _, last = spec.partition("-")
        indices = list(range(int(first), int(last or first) + 1))
        throttle = int(limit) if limit else len(indices)
    with _state() as state:
        job = state["next_id"]
        state["next_id"] += len(indices) + 1
        copy = _dir() / "scripts" / f"{job}.sh"  # SLURM runs the script as it was at submission
        copy.parent.mkdir(exist_ok=True)
        copy.write_text(script.read_text())
        for offset, index in enumerate(indices):
            key = str(job) if index is None else f"{job}_{index}"
            state["tasks"][key] = {
                "key": key,
                "array": None if index is None else str(job),
                "index": index,
                "raw_id": job + offset,
                "name": options.get("job-name", "sbatch"),
                "cpus": options.get("cpus-per-task"),
                "output": options.get("output", "slurm-%j.out"),
                "error": options.get("error", options.get("output", "slurm-%j.out")),
                "script": str(copy),
                "cwd": os.getcwd(),
                "throttle": throttle,
                "state": "PENDING",
                "restarts": 0,
                "requeue": False,
                "accounting": True,
                "batch_pid": None,
                "step_pid": None,
                "exit_code": None,
            }
        held = os.environ.get("FAKE_SLURM_HOLD") == "1"
        if not held:
            runner = subprocess.Popen(
                [sys.executable, __file__, "_run", str(job)],
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=open(_dir() / f"runner_{job}.log", "w"),  # noqa: SIM115 - the child keeps it
                stderr=subprocess.STDOUT,
            )
            state.setdefault("runners", []).append(runner.pid)
    _log("sbatch.log", {"job": str(job), "script": str(copy), "options": options, "held": held})
    print(f"Submitted batch job {job}")
    return 0


def _run(args: list[str]) -> int:
    """The runner of one submitted job: starts its tasks up to the throttle, and settles each as it ends."""
    job = args[0]
    processes: dict[str, subprocess.Popen] = {}
    while True:
        with _state() as state:
            tasks = [t for t in state["tasks"].values() if _matches(t, job)]
            for key, process in list(processes.items()):
                code = process.poll()
                if code is None:
                    continue
                del processes[key]
                task = state["tasks"][key]
                task["exit_code"], task["batch_pid"], task["step_pid"] = code, None, None
                if task["requeue"]:
                    task.update(state="PENDING", requeue=False, restarts=task["restarts"] + 1)
                elif task["state"] != "CANCELLED":
                    task["state"] = "COMPLETED" if code == 0 else "FAILED"
            running = sum(t["state"] in ("RUNNING", "REQUEUED") for t in tasks)
            for task in tasks:
                if task["state"] == "PENDING" and running < task["throttle"]:
                    processes[task["key"]] = _start(task)
                    task.update(state="RUNNING", batch_pid=processes[task["key"]].pid)
                    running += 1
            if not processes and not any(t["state"] == "PENDING" for t in tasks):
                return 0
        time.sleep(0.1)


def _start(task: dict[str, Any]) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(
        SLURM_JOB_ID=str(task["raw_id"]),
        SLURM_JOB_NAME=task["name"],
        SLURM_NTASKS="1",
        SLURM_JOB_NUM_NODES="1",
        SLURM_NODEID="0",
        SLURM_JOB_NODELIST="localhost",
        SLURM_RESTART_COUNT=str(task["restarts"]),
        SLURM_SUBMIT_DIR=task["cwd"],
    )
    if task["cpus"]:
        env["SLURM_CPUS_PER_TASK"] = task["cpus"]
    if task["array"] is not None:
        env.update(SLURM_ARRAY_JOB_ID=task["array"], SLURM_ARRAY_TASK_ID=str(task["index"]))
    stdout = open(_expand(task["output"], env), "a")  # noqa: SIM115 - the child keeps it
    stderr = open(_expand(task["error"], env), "a")  # noqa: SIM115
    return subprocess.Popen(
        ["bash", task["script"]], cwd=task["cwd"], env=env, stdout=stdout, stderr=stderr, start_new_session=True
    )


# ----------------------------------------------------------------------------- srun
def srun(args: list[str]) -> int:
    with_value = {"--output", "-o", "--error", "-e", "--ntasks", "-n", "--cpus-per-task", "-c", "--nodes", "-N"}
    options: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        key, has_value, value = args[i].partition("=")
        if not has_value and key in with_value:
            i, value = i + 1, args[i + 1]
        options[key] = value
        i += 1
    command = args[i:]
    env = dict(os.environ, SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_STEP_ID="0")
    key = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}" if "SLURM_ARRAY_JOB_ID" in env else None
    with _state() as state:
        for task in state["tasks"].values():
            if task["key"] == key or (key is None and str(task["raw_id"]) == env["SLURM_JOB_ID"]):
                task["step_pid"] = os.getpid()
    for flag, fd in (("--output", 1), ("--error", 2)):
        path = options.get(flag, options.get(flag[1:3]))
        if path:
            target = os.open(_expand(path, env), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(target, fd)
    os.execvpe(command[0], command, env)  # the step keeps this process id: scancel --signal reaches it


# ----------------------------------------------------------------------------- sacct
def sacct(args: list[str]) -> int:
    fields, ids, header = ["JobID", "State"], [], True
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-o", "--format"):
            fields, i = args[i + 1].split(","), i + 1
        elif arg.startswith("--format="):
            fields = arg.split("=", 1)[1].split(",")
        elif arg in ("-j", "--jobs"):
            ids, i = ids + args[i + 1].split(","), i + 1
        elif arg in ("-n", "--noheader"):
            header = False
        i += 1
    with _state() as state:
        tasks = [t for t in state["tasks"].values() if t["accounting"] and any(_matches(t, j) for j in ids)]
    rows = []
    pending: dict[str, list[dict[str, Any]]] = {}
    for task in tasks:
        if task["state"] == "PENDING" and task["array"] is not None and task["restarts"] == 0:
            pending.setdefault(task["array"], []).append(task)
            continue
        state = {"CANCELLED": f"CANCELLED by {os.getuid()}"}.get(task["state"], task["state"])
        node = "None assigned" if task["state"] == "PENDING" else "localhost"
        rows.append({"JobID": task["key"], "State": state, "NodeList": node, "JobName": task["name"]})
        if task["state"] != "PENDING":
            step = "CANCELLED" if task["state"] == "REQUEUED" else state
            rows.append({"JobID": task["key"] + ".batch", "State": step, "NodeList": node, "JobName": "batch"})
    for array, waiting in pending.items():  # SLURM shows an array's pending tasks as one line
        indices = sorted(t["index"] for t in waiting)
        ranges, start = [], indices[0]
        for previous, current in zip(indices, indices[1:] + [None], strict=True):
            if current != previous + 1:
                ranges.append(f"{start}-{previous}" if previous != start else f"{start}")
                start = current
        throttle = waiting[0]["throttle"]
        name = f"{array}_[{','.join(ranges)}%{throttle}]"
        rows.append({"JobID": name, "State": "PENDING", "NodeList": "None assigned", "JobName": waiting[0]["name"]})
    if header:
        print("|".join(fields))
    for row in rows:
        print("|".join(row.get(name, "") for name in fields))
    return 0


# ----------------------------------------------------------------------------- scancel, scontrol
def _signal(name: str) -> int:
    return int(name) if name.isdigit() else int(signal.Signals[name if name.startswith("SIG") else "SIG" + name])


def scancel(args: list[str]) -> int:
    ids, sig = [], None
    i = 0
    while i < len(args):
        if args[i] in ("--signal", "-s"):
            sig, i = _signal(args[i + 1]), i + 1
        elif args[i].startswith("--signal="):
            sig = _signal(args[i].split("=", 1)[1])
        else:
            ids.append(args[i])
        i += 1
    _log("scancel.log", {"ids": ids, "signal": sig})
    kill = []
    with _state() as state:
        for job_id in ids:
            tasks = [t for t in state["tasks"].values() if _matches(t, job_id)]
            if not tasks:
                print(f"scancel: error: Kill job error on job id {job_id}: Invalid job id specified", file=sys.stderr)
                return 1
            for task in tasks:
                if sig is not None:
                    pid = task["step_pid"] or task["batch_pid"]
                    if pid and task["state"] in ("RUNNING", "REQUEUED"):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, sig)
                elif task["state"] not in FINAL:
                    if task["batch_pid"]:
                        kill.append(task["batch_pid"])
                    task["state"] = "CANCELLED"
    for sig_ in (signal.SIGTERM, signal.SIGKILL):  # submitit's jobs ignore SIGTERM, as on a real cluster
        for pid in kill:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig_)
        if kill and sig_ == signal.SIGTERM:
            time.sleep(1.0)
    return 0


def scontrol(args: list[str]) -> int:
    if len(args) != 2 or args[0] != "requeue":
        print(f"fake scontrol: only 'requeue <job id>' is implemented, got {args}", file=sys.stderr)
        return 1
    _log("scontrol.log", {"args": args})
    with _state() as state:
        tasks = [t for t in state["tasks"].values() if _matches(t, args[1]) and t["state"] == "RUNNING"]
        for task in tasks:
            task.update(requeue=True, state="REQUEUED")
    if not tasks:
        print(f"scontrol: error: Invalid job id specified: {args[1]}", file=sys.stderr)
        return 1
    return 0


# ----------------------------------------------------------------------------- the tests' side
class FakeSlurm:
    """The tests' handle on the fake: its state, its logs, and what a real cluster does to jobs on its own."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def environment(self) -> dict[str, str]:
        """What to set for the tools to find this fake: PATH first, then its state folder."""
        return {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "FAKE_SLURM_DIR": str(self.folder)}

    def tasks(self) -> dict[str, dict[str, Any]]:
        with _state(self.folder) as state:
            return state["tasks"]

    def log(self, name: str) -> list[dict[str, Any]]:
        path = self.folder / f"{name}.log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def wait_for(self, key: str, state: str, timeout: float = 240.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            task = self.tasks().get(key)
            if task is not None and task["state"] == state and (state != "RUNNING" or task["step_pid"]):
                return task
            time.sleep(0.1)
        raise TimeoutError(f"fake SLURM task {key} never reached {state}: {self.tasks().get(key)}")

    def forget(self, key: str) -> None:
        """The accounting database drops the task: sacct no longer lists it."""
        with _state(self.folder) as state:
            state["tasks"][key]["accounting"] = False

    def end(self, key: str, state: str = "FAILED") -> None:
        """Ends a task that never ran (held by ``FAKE_SLURM_HOLD``) in ``state``, as the cluster would report it."""
        with _state(self.folder) as fake:
            fake["tasks"][key]["state"] = state

    def kill(self, key: str, sig: int = signal.SIGKILL) -> None:
        """Kills a running task's step (a node failure, the OOM killer)."""
        with _state(self.folder) as state:
            pid = state["tasks"][key]["step_pid"]
        os.kill(pid, sig)

    def kill_all(self) -> None:
        """Ends every process this fake started (runners and tasks)."""
        with _state(self.folder) as state:
            groups = [t["batch_pid"] for t in state["tasks"].values() if t["batch_pid"]]
            groups += state.get("runners", [])
        for pid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


TOOLS = {"sbatch": sbatch, "srun": srun, "sacct": sacct, "scancel": scancel, "scontrol": scontrol, "_run": _run}

if __name__ == "__main__":
    sys.exit(TOOLS[sys.argv[1]](sys.argv[2:]))
