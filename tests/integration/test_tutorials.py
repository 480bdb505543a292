"""The tutorials, followed as a new user follows them: each page's shell blocks run in order
with bash, in a fresh directory holding the repository's examples, against the stack the first
starts (``eventbus up``, a fresh EVENTBUS_HOME); the files it says to save are taken from the
page; what it says the reader will see is checked (``tests/docs/tutorial.py``). The pages
continue on the stack of the page before, as a reader who goes on keeps it: they are
followed in the site's order in one directory, on one stack, which the last page stops. A
page that is wrong fails here: fix the page."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.docs.blocks import DOCS, ROOT
from tests.docs.tutorial import Step, mismatch, steps

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.ray,
    pytest.mark.redis,
    pytest.mark.slow,
]

STATE = ".docs-test-env"  # the shell's variables, carried from one block to the next
# Each block runs as the reader types it, with the variables of the blocks before it; bash
# stops at the first failing command.
PROLOGUE = f"set -a; [ -f {STATE} ] && . ./{STATE}; set -eo pipefail\n"
EPILOGUE = f"\nexport -p > {STATE}\n"


class Tutorial:
    """Pages' steps run in ``workdir``: a clone's examples, the repository's venv on PATH."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        shutil.copytree(
            ROOT / "examples", workdir / "examples", ignore=shutil.ignore_patterns("__pycache__")
        )
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "EVENTBUS_"))
        }
        venv_bin = str(Path(sys.executable).parent)
        src = str(ROOT / "src")  # this checkout's code, whatever the venv's editable install
        env.update(
            PATH=f"{venv_bin}:{env.get('PATH', '/usr/bin:/bin')}",
            PYTHONPATH=f"{src}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else src,
            EVENTBUS_HOME=str(workdir / "eventbus-home"),
            COLUMNS="200",  # a wide terminal: rich tables and lines unwrapped
            PYTHONUNBUFFERED="1",  # a background program prints as on a terminal
            RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        )
        self.env = env
        self.background: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.transcript: list[str] = []

    def run(self, page: Path) -> None:
        for step in steps(page):
            t0 = time.monotonic()
            if step.kind == "file":
                (self.workdir / step.name).write_text(step.block.text)
            elif step.kind == "background":
                self._start(step)
            elif step.kind == "await":
                self._await(step)
            else:
                self._shell(step)
            print(f"{step.block.where}: {step.kind} {time.monotonic() - t0:.1f} s")

    def _shell(self, step: Step) -> None:
        res = subprocess.run(
            ["bash", "-c", PROLOGUE + step.block.text + EPILOGUE],
            cwd=self.workdir,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=240,
            check=False,
        )
        self.transcript.append(f"$ {step.block.where}\n{res.stdout}")
        assert res.returncode == 0, (
            f"{step.block.where}: the block failed (exit {res.returncode}):\n"
            f"{step.block.text}\n--- output\n{res.stdout}"
        )
        if step.expected is not None:
            missing = mismatch(step.expected, res.stdout, step.unordered)
            assert missing is None, (
                f"{step.block.where}: the page says the reader sees\n{missing}\n"
                f"--- but the block printed\n{res.stdout}"
            )

    def _start(self, step: Step) -> None:
        log = self.workdir / f"background-{len(self.background)}.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                ["bash", "-c", PROLOGUE + "exec " + step.block.text.strip()],
                cwd=self.workdir,
                env=self.env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.background.append((proc, log))

    def _await(self, step: Step, within_s: float = 60) -> None:
        assert self.background, f"{step.block.where}: no background block runs before it"
        proc, log = self.background[-1]
        assert step.expected is not None
        deadline = time.monotonic() + within_s
        while (missing := mismatch(step.expected, log.read_text(), unordered=True)) is not None:
            assert proc.poll() is None, f"{step.block.where}: the background block exited:\n" + (
                log.read_text()
            )
            assert time.monotonic() < deadline, (
                f"{step.block.where}: within {within_s:.0f} s the background block did not "
                f"print\n{missing}\n--- it printed\n{log.read_text()}"
            )
            time.sleep(0.2)

    def close(self) -> None:
        """Stop what the pages started, whether or not they got as far as `eventbus down`."""
        for proc, _ in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
        if not (self.workdir / "eventbus-home" / "stack.json").exists():
            return  # no stack was started, or `eventbus down` stopped it
        down = subprocess.run(
            ["eventbus", "down"],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if down.returncode != 0:  # reported, not raised: the page's own failure comes first
            print(f"eventbus down failed: {down.stdout}{down.stderr}")


def follow(pages: list[Path], workdir: Path) -> None:
    """Follow ``pages`` in order in ``workdir``, each on the stack the one before left."""
    tutorial = Tutorial(workdir)
    try:
        for page in pages:
            tutorial.run(page)
    finally:
        tutorial.close()
    print("\n".join(tutorial.transcript))


def _shells(page: Path) -> list[str]:
    return [s.block.text.strip() for s in steps(page) if s.kind == "shell"]


# The site's tutorials in its order, on one stack as a reader who goes on keeps it: the first
# (up, deploy, publish, tail, HTTP, status), webhooks (a stored secret, a subscriber, signed
# webhooks, refusals), joins and windows (`eventbus test`, in process), a model stage (deploy,
# score, push, split, down). ~4 min on a loaded 2-core machine; a stack per page would add an
# `up`, a `down` and a Ray Serve start each (~60 s).
@pytest.mark.timeout(1200)
def test_the_tutorials_run_as_written_in_order_on_one_stack(tmp_path: Path) -> None:
    names = ("first-pipeline", "webhooks", "joins-and-windows", "model-stage")
    pages = [DOCS / "tutorials" / f"{n}.md" for n in names]
    assert sorted(pages) == sorted((DOCS / "tutorials").glob("*.md")), "a tutorial not run"
    first, hooks, joins, model = pages
    assert _shells(first)[1].startswith("eventbus up"), "the first page starts the stack"
    kinds = [s.kind for s in steps(hooks)]
    assert kinds.count("file") == 3 and "background" in kinds and "await" in kinds
    assert not any("eventbus up" in s for s in _shells(joins)), "joins run in process"
    assert _shells(model)[-1].endswith("eventbus down"), "the last page stops the stack"
    for page in pages:
        shells = [s for s in steps(page) if s.kind == "shell"]
        assert shells and all(s.expected for s in shells), f"{page.name}: a step without its output"
        if page != model:
            assert not any("eventbus down" in s for s in _shells(page)), (
                f"{page.name} stops the stack the next pages run on"
            )
    with socket.socket() as probe:  # the webhooks page's subscriber listens on 127.0.0.1:9000
        busy = probe.connect_ex(("127.0.0.1", 9000)) == 0
    assert not busy, "port 9000, the webhooks tutorial's subscriber's, is taken: free it"
    follow(pages, tmp_path)
