"""CPU per router callback, measured inside the router process: the profiles' ``--callbacks``.

py-spy samples wall-clock time, so on a shared 2-core machine it charges a system call with
the time the router waited for a core, and hides how much CPU each step costs. Here a
``sitecustomize`` written into the scratch directory wraps chosen functions of the router (the
router's code is unchanged) and adds up the thread CPU clock around each call; a coroutine's
steps are timed one by one, the awaits between them not. SIGUSR2 starts the count, SIGUSR1
writes it as JSON. A hook whose target this version of the router lacks is skipped, so a
profile can run against an older tree.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

PRELUDE = '''
import inspect, json, os, signal, sys, time
if sys.orig_argv[sys.orig_argv.index("-m") + 1:][:1] == ["router"] if "-m" in sys.orig_argv else False:
    spent, clock, began = {}, time.thread_time_ns, [time.thread_time_ns()]

    def restart(*_):
        spent.clear()
        began[0] = clock()

    def dump(*_):
        with open(os.environ["STARGATE_BENCH_CALLBACKS"], "w") as out:
            json.dump({"main thread": [clock() - began[0], 1], **spent}, out)

    # Installed first: a hook that fails to install must not leave SIGUSR2 fatal.
    signal.signal(signal.SIGUSR2, restart)
    signal.signal(signal.SIGUSR1, dump)

    def note(key, ns):
        entry = spent.setdefault(key, [0, 0])
        entry[0] += ns
        entry[1] += 1

    class _Await:
        def __init__(self, yielded):
            self.yielded = yielded
        def __await__(self):
            return (yield self.yielded)

    def hook(owner, name, label, split=None):
        original = getattr(owner, name, None)
        if original is None:  # a name this version of the router does not have
            return
        if inspect.iscoroutinefunction(original):
            async def stepped(*args, **kwargs):  # each step timed, the awaits in between not
                coro, value, error = original(*args, **kwargs), None, None
                while True:
                    started = clock()
                    try:  # what the await raised (a timeout's cancel) goes into the coroutine
                        awaited = coro.send(value) if error is None else coro.throw(error)
                    except StopIteration as stop:
                        note(label, clock() - started)
                        return stop.value
                    except BaseException:
                        note(label, clock() - started)
                        raise
                    note(label, clock() - started)
                    value = error = None
                    try:
                        value = await _Await(awaited)
                    except BaseException as exc:
                        error = exc
            setattr(owner, name, stepped)
            return
        def timed(*args, **kwargs):
            key = split(*args) if split else label  # before the call changes what it looks at
            started = clock()
            try:
                return original(*args, **kwargs)
            finally:
                note(key, clock() - started)
        setattr(owner, name, timed)

'''
"""The hooks' machinery; a profile appends its own ``hook(...)`` lines (indented by 4)."""


def install(workdir: Path, hooks: str) -> Path:
    """Write the ``sitecustomize`` (``PRELUDE`` + ``hooks``) and point this process's environment,
    which the router children inherit, at it; returns where the counts will be written."""
    directory = workdir / "hooks"
    directory.mkdir()
    (directory / "sitecustomize.py").write_text(PRELUDE + hooks)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(directory)]))
    out = workdir / "callbacks.json"
    os.environ["STARGATE_BENCH_CALLBACKS"] = str(out)
    return out


def start(pid: int) -> None:
    """Count from now on (what the warm-up spent is forgotten)."""
    os.kill(pid, signal.SIGUSR2)


def stop(pid: int) -> None:
    """Have the router write its counts (read them with ``print_split``)."""
    os.kill(pid, signal.SIGUSR1)
    time.sleep(0.5)


def print_split(spent: dict[str, list[int]], done: int, unit: str = "conn") -> None:
    """Each hooked callback's CPU per connection (``  of which`` lines are inside the line above)."""
    total = spent.pop("main thread")[0]
    print(f"{'main thread CPU':52s} {total / done / 1000:7.1f} us/{unit}")
    if not spent:  # the sitecustomize's imports failed in the router (its stderr says so), or nothing ran
        print("no hooked callback ran: did the hooks install? (the router's stderr: 'Error in sitecustomize')")
        return
    accounted = 0
    for name, (ns, calls) in sorted(spent.items(), key=lambda kv: -kv[1][0]):
        accounted += 0 if name.startswith(" ") else ns
        print(f"{name:52s} {ns / done / 1000:7.1f} us/{unit} {calls / done:6.2f} calls/{unit} "
              f"{ns / calls / 1000:7.1f} us/call")
    outside = (total - accounted) / done / 1000
    print(f"{'outside these callbacks (event loop, epoll, tasks)':52s} {outside:7.1f} us/{unit}")
