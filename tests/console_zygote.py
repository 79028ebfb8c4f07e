"""A process that has imported `maskrcnn-dist`'s heavy modules once and forks a child per console call:
the `console` fixture's way to run the real console script without paying torch's import each time.

Run by tests/conftest.py as `python tests/console_zygote.py`: it imports torch, torchvision and the CLI,
says how many threads it has (one: forking is safe), then serves one JSON request per line on stdin
(argv, env, cwd, stdout and stderr files) with two JSON lines: the child's pid when it starts, and
when it ends its exit code (negative: killed by that signal) and what it did that makes a test slow
(tests/tiers.py: optimizer steps, programs it started).

The child is the console script as a user runs it, but for having been forked: its own environment,
folder, argv and standard streams (files, fd 1 and 2), the entry point called as the script calls it,
and the interpreter's own way of ending (exit_code_of: an uncaught exception printed with exit 1, threads
joined, atexit handlers, flushing).
What it cannot show: a warning or a print that happens while these modules are imported (the zygote
itself must print nothing, which the fixture checks), and a module that reads the environment when
it is imported (none does: the kit reads it at call time).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
from importlib.metadata import entry_points
from typing import Any

SCRIPTS = {"maskrcnn-dist"}  # the console scripts served from here (the launcher's need no torch)


def entry_of(script: str) -> Any:
    (found,) = [ep for ep in entry_points(group="console_scripts") if ep.name == script]
    return found.load()


def run_child(request: dict[str, Any], report: str) -> None:
    """In the forked child: become the console script, run it and exit as its process would."""
    os.setpgid(0, 0)  # its own group: a timeout kills it and whatever it started
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_DFL if signum != signal.SIGINT else signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    stdin = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    for fd, target in ((stdin, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own streams, as at start-up
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    sys.argv = [request["argv0"], *request["args"]]
    watch_work(report)
    os._exit(exit_code_of(entry_of(request["script"])))


def exit_code_of(entry: Any) -> int:
    """Run the entry point as the console script does (`sys.exit(main())`) and end as the interpreter
    ends: non-daemon threads joined, atexit handlers run, garbage finalized, streams flushed. What is
    skipped is the teardown of every module, which in a forked child touches (copies) every page the
    zygote shares with it: 6 s of a 6.3 s call."""
    import atexit
    import gc
    import threading
    import traceback

    try:
        code = entry()
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        traceback.print_exc()
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    threading._shutdown()  # type: ignore[attr-defined] - what Py_FinalizeEx does first
    atexit._run_exitfuncs()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return code or 0


def watch_work(report: str) -> None:
    """Record what tests/tiers.py asks about (optimizer steps, programs started) into `report` at exit."""
    import atexit

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    seen: dict[str, Any] = {"steps": 0, "process": ""}

    def audit(event: str, args: tuple) -> None:
        if event in ("subprocess.Popen", "os.posix_spawn", "os.exec") and not seen["process"]:
            argv = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
            seen["process"] = " ".join(" ".join(os.fsdecode(w) for w in argv).split())[:200]

    def step(*_: object) -> None:
        seen["steps"] += 1

    def write() -> None:
        with open(report, "w") as file:
            json.dump(seen, file)

    sys.addaudithook(audit)
    register_optimizer_step_pre_hook(step)
    atexit.register(write)


def serve() -> None:
    import torch  # noqa: F401 - what every console call pays for otherwise
    import torchvision  # noqa: F401

    for script in SCRIPTS:
        entry_of(script)
    import maskrcnn_dist.train  # noqa: F401 - the train command's modules

    gc.freeze()  # what is here now is never collected in a child: no copy of its pages
    reply = sys.stdout
    # Forking is safe while this process has one thread (torch starts its pools at the first parallel op).
    print(json.dumps({"threads": len(os.listdir("/proc/self/task"))}), file=reply, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        report = request["stderr"] + ".work.json"
        pid = os.fork()
        if pid == 0:
            run_child(request, report)  # never returns
        print(json.dumps({"pid": pid}), file=reply, flush=True)
        _, status = os.waitpid(pid, 0)
        work = {"steps": 0, "process": ""}
        if os.path.exists(report):
            with open(report) as file:
                work = json.load(file)
            os.unlink(report)
        print(json.dumps({"code": os.waitstatus_to_exitcode(status), **work}), file=reply, flush=True)


if __name__ == "__main__":
    serve()
