"""py-spy helpers of ``peers.py --profile``: record a process, then rank its frames.

``py-spy record --format raw`` writes collapsed stacks (``frame;frame;... count``). ``top``
ranks frames by self samples (the leaf: where the CPU is) and by total samples (the frame is
anywhere on the stack: what it costs with its callees).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        msg = "py-spy is missing: `make bench` installs it (pip install py-spy)"
        raise RuntimeError(msg)
    return found


def record(pid: int, out: Path, rate: int = 200, idle: bool = False) -> subprocess.Popen[bytes]:
    """Start sampling ``pid`` until :func:`finish`: the thread holding the GIL only.

    ``--gil``: the Python CPU that the process's throughput is bound by (idle loops waiting in
    epoll or in Ray's C++ task loop would otherwise count as busy frames). ``idle``: every
    thread, waiting or not, each stack under its thread's name (wall time: where a thread
    waits, e.g. the sources' loop on a Redis reply).
    """
    cmd = [py_spy(), "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate)]
    cmd += ["--idle", "--threads"] if idle else ["--gil"]
    cmd += ["--nonblocking", "--output", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
    proc.wait(timeout=30)


def _short(frame: str) -> str:
    # "func (path/to/module.py:123)" -> "func (module.py:123)"
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.rstrip(')')).name})" if where else name


def top(raw: Path, n: int = 15) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """(total samples, the top ``n`` frames by self samples, by total samples)."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        samples += k
        frames = [_short(f) for f in stack.split(";")]
        own[frames[-1]] += k
        for f in set(frames):
            total[f] += k
    return samples, own.most_common(n), total.most_common(n)


def render(title: str, raw: Path, n: int = 15) -> str:
    samples, own, total = top(raw, 2 * n)
    own = own[:n]
    lines = [f"### {title} ({samples} samples)", "", "| self % | frame |", "| ---: | --- |"]
    lines += [f"| {100 * k / samples:.1f} | `{f}` |" for f, k in own]
    lines += ["", "| total % | frame |", "| ---: | --- |"]
    # frames on (nearly) every stack (thread bootstrap, the event loop's runner) say nothing
    lines += [f"| {100 * k / samples:.1f} | `{f}` |" for f, k in total if k < 0.95 * samples][:n]
    return "\n".join(lines)
