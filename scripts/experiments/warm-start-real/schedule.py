"""Running the study's programs: several at once, in priority order, each after the jobs it needs, until a deadline.

A job is one program run (a subprocess at the repository root) with its log file. The runner starts the first job in
the list whose needs have finished, as long as fewer than `parallel` run; a job whose need failed or ran out of time
is not started. At the deadline every running job is stopped (its process group killed) and recorded as unfinished:
on a GPU whose time is counted, a partial table is worth more than none.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Seconds between two looks at the running jobs.
POLL_SECONDS = 0.5


@dataclass
class Job:
    """
    One program run.

    Args:
        name (`str`): unique; names the log file and the record.
        command (`list[str]`): the program and its arguments, run as `python <command>` at the repository root.
        output (`Path`, *optional*): its output folder; a folder that already holds `metrics.json` (or `done_file`)
            means the job ran before and is not repeated.
        needs (`tuple[str, ...]`): jobs that must have finished first.
        done_file (`str`): the file whose presence in `output` marks the job done.
    """

    name: str
    command: list[str]
    output: Path | None = None
    needs: tuple[str, ...] = ()
    done_file: str = "metrics.json"
    status: str = "waiting"
    seconds: float | None = None
    started: float | None = field(default=None, repr=False)
    process: Any = field(default=None, repr=False)

    def already_done(self, root: Path) -> bool:
        return self.output is not None and (root / self.output / self.done_file).is_file()


def shell_command(command: list[str], threads: int | None = None) -> str:
    """How a run is recorded: a command line to paste at the repository root."""
    prefix = f"OMP_NUM_THREADS={threads} " if threads else ""
    return prefix + "python " + " ".join(command)


def run_jobs(
    jobs: list[Job],
    root: Path,
    logs: Path,
    python: str,
    env: dict[str, str],
    parallel: int = 1,
    deadline: float | None = None,
) -> dict[str, dict[str, Any]]:
    """
    Run `jobs` (in list order of priority) `parallel` at a time until all have ended or `deadline` (a `time.time()`
    value) passes.

    Args:
        jobs (`list[Job]`): the jobs; needs must name jobs of the list.
        root (`Path`): the repository root (the working directory of every program).
        logs (`Path`): folder of the log files (`<name>.log`).
        python (`str`): the interpreter.
        env (`dict`): the programs' environment.
        parallel (`int`, *optional*, defaults to 1): jobs at once.
        deadline (`float`, *optional*): when to stop every job still running.

    Returns:
        `{name: {"command", "status", "seconds"}}` with status `done`, `reused`, `failed` (exit status in the log),
        `unfinished` (stopped at the deadline), `not started` (the deadline came first) or `skipped` (a need did not
        finish).
    """
    names = {job.name for job in jobs}
    for job in jobs:
        unknown = set(job.needs) - names
        if unknown:
            raise ValueError(f"Job {job.name!r} needs unknown job(s) {sorted(unknown)}.")
    logs.mkdir(parents=True, exist_ok=True)
    for job in jobs:
        if job.already_done(root):
            job.status = "reused"
    finished = {"done", "reused"}
    try:
        while True:
            now = time.time()
            running = [job for job in jobs if job.status == "running"]
            for job in running:
                code = job.process.poll()
                if code is not None:
                    job.status = "done" if code == 0 else "failed"
                    job.seconds = round(now - job.started, 1)
            if deadline is not None and now >= deadline:
                _stop(jobs, now)
                break
            for job in jobs:
                if job.status == "waiting" and any(_status(jobs, need) in ("failed", "skipped") for need in job.needs):
                    job.status = "skipped"
            running = [job for job in jobs if job.status == "running"]
            for job in jobs:
                if len(running) >= parallel:
                    break
                if job.status == "waiting" and all(_status(jobs, need) in finished for need in job.needs):
                    _start(job, root, logs, python, env)
                    running.append(job)
            if not any(job.status in ("waiting", "running") for job in jobs):
                break
            if not running:  # only jobs whose needs can never finish are left
                for job in jobs:
                    if job.status == "waiting":
                        job.status = "skipped"
                break
            time.sleep(POLL_SECONDS)
    except BaseException:  # an interrupted runner (Ctrl-C, SIGTERM) takes its programs with it
        _stop(jobs, time.time())
        raise
    return {
        job.name: {"command": shell_command(job.command), "status": job.status, "seconds": job.seconds} for job in jobs
    }


def _status(jobs: list[Job], name: str) -> str:
    return next(job.status for job in jobs if job.name == name)


def _start(job: Job, root: Path, logs: Path, python: str, env: dict[str, str]) -> None:
    log = open(logs / f"{job.name}.log", "w", encoding="utf-8")  # noqa: SIM115 (closed with the process)
    job.process = subprocess.Popen(
        [python, *job.command],
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the deadline stops the program and its workers together
    )
    log.close()  # the child holds its own descriptor
    job.status, job.started = "running", time.time()


def _stop(jobs: list[Job], now: float) -> None:
    for job in jobs:
        if job.status == "running":
            try:
                os.killpg(job.process.pid, signal.SIGTERM)
                job.process.wait(timeout=20)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(job.process.pid, signal.SIGKILL)
                job.process.wait()
            job.status, job.seconds = "unfinished", round(now - job.started, 1)
        elif job.status == "waiting":
            job.status = "not started"
