"""A process that has imported `maskrcnn-dist`'s heavy modules once and forks a child for each trainer
the suite starts: torch, torchvision and the kit are imported once a session, not ~300 times (5-7 CPU
seconds each on the 2-core hosts CI runs on).

Run by tests/conftest.py as `python tests/zygote.py SOCKET`. It imports, says how many threads it has
(one: forking is safe; it runs with OMP_NUM_THREADS=1) on stdout, then serves two kinds of request, from one thread:
- the `console` fixture's: one JSON line on stdin (argv, env, cwd, stdout and stderr files), answered by
  two JSON lines on stdout: the child's pid when it starts, and when it ends its exit code (negative:
  killed by that signal) and what it did that makes a test slow (tests/tiers.py: optimizer steps,
  programs it started);
- a proxy's, on the unix socket SOCKET: any process of the suite started as `python -m maskrcnn_dist.cli
  ...` or as the `maskrcnn-dist` script (by a test, the launcher, torchrun) runs tests/zygote_site/
  sitecustomize.py first, which hands its argv, environment, folder, signal mask and standard streams
  (the descriptors themselves) to this server and then stands in for the child forked here: it passes on
  the signals it is sent, and ends as the child ended (the same code, or killed by the same signal). A
  proxy that dies (SIGKILL) takes its child with it (SIGKILL to the child's process group).

The child is the program as a user runs it, but for having been forked: its own environment, folder,
argv, signal mask, ignored signals, standard streams and thread count (OMP_NUM_THREADS), the module run
as `-m` runs it, and the interpreter's own way of ending (exit_code_of). What it cannot show: a warning or
a print while these modules are imported (the server must print nothing, which the fixture checks); a
module that reads the environment when it is imported (the kit reads it at call time; torch's C++ log
level is read at load, which is why the torchrun wrapper, which sets it for its agent, is not served);
a per-process hash seed (the children share the server's); a process tree below the pid its parent sees
(a test that freezes a trainer or walks its tree is marked `real_processes`: no proxy for it).
"""

from __future__ import annotations

import gc
import io
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
import types
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

SCRIPTS = {"maskrcnn-dist"}  # the console scripts served (the launcher's need no torch)
SOCKET_VAR = "MASKRCNN_TEST_ZYGOTE"  # where proxies find this server (tests/conftest.py exports it)
PYTHON_VAR = "MASKRCNN_TEST_ZYGOTE_PYTHON"  # the interpreter it serves: another one runs as it is
PID_VAR = "MASKRCNN_TEST_ZYGOTE_PID"  # tests/timings.py counts the CPU of the children it reaps
HEADER = struct.Struct("!I")  # a proxy's request: its length, the standard streams attached, then JSON


def entry_of(script: str) -> Any:
    (found,) = [ep for ep in entry_points(group="console_scripts") if ep.name == script]
    return found.load()


def preload() -> None:
    """Import what the served programs import (their children share these pages). The server runs with
    OMP_NUM_THREADS=1: torch then starts no thread while it loads, so forking is safe."""
    import pycocotools.cocoeval  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed.rpc  # noqa: F401 - the pipeline engine's
    import torchvision  # noqa: F401

    for script in SCRIPTS:
        entry_of(script)
    import maskrcnn_dist.cli.run  # noqa: F401 - the train command's modules
    import maskrcnn_dist.engines.elastic_ddp  # noqa: F401
    import maskrcnn_dist.engines.pipeline.engine  # noqa: F401
    import maskrcnn_dist.train  # noqa: F401


# -- the child's side: become the program --------------------------------------------------------------


def become(env: dict[str, str], cwd: str, streams: tuple[int, int, int], unbuffered: bool) -> None:
    """In the forked child: the process's environment, folder and standard streams (fds 0-2, then
    sys.std* over them as at start-up), and Python's own signal dispositions."""
    os.setpgid(0, 0)  # its own group: a timeout or a dead proxy kills it and whatever it started
    signal.set_wakeup_fd(-1)
    for signum, handler in DEFAULT_HANDLERS.items():
        signal.signal(signum, handler)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, target in zip(streams, (0, 1, 2)):
        if fd != target:
            os.dup2(fd, target)
    for fd in set(streams) - {0, 1, 2}:
        os.close(fd)
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115 - the process's own streams
    sys.stdout = sys.__stdout__ = _text_stream(1, unbuffered, line=os.isatty(1))
    sys.stderr = sys.__stderr__ = _text_stream(2, unbuffered, line=True)


DEFAULT_HANDLERS = {  # what CPython installs at start-up; every other signal keeps its default
    signal.SIGINT: signal.default_int_handler,
    signal.SIGPIPE: signal.SIG_IGN,
    signal.SIGXFSZ: signal.SIG_IGN,
    signal.SIGTERM: signal.SIG_DFL,
    signal.SIGCHLD: signal.SIG_DFL,
}


def _text_stream(fd: int, unbuffered: bool, line: bool) -> io.TextIOWrapper:
    """sys.stdout/sys.stderr as CPython makes them: unbuffered with -u or PYTHONUNBUFFERED."""
    raw = io.FileIO(fd, "w", closefd=False)
    errors = "backslashreplace" if fd == 2 else "strict"
    if unbuffered:
        return io.TextIOWrapper(raw, encoding="utf-8", errors=errors, line_buffering=line, write_through=True)
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8", errors=errors, line_buffering=line)


def set_threads(env: dict[str, str]) -> None:
    """The child's OMP_NUM_THREADS, else what torch takes in a fresh process: the CPUs it may run on."""
    import torch

    wanted = env.get("OMP_NUM_THREADS", "")
    torch.set_num_threads(int(wanted) if wanted.isdigit() and int(wanted) > 0 else len(os.sched_getaffinity(0)))


def exit_code_of(entry: Any) -> int:
    """Run the entry point as the interpreter runs a program and end as it ends: non-daemon threads
    joined, atexit handlers run, garbage finalized, streams flushed. What is skipped is the teardown of
    every module, which in a forked child touches (copies) every page the server shares with it: 6 s of
    a 6.3 s call. A KeyboardInterrupt ends it by SIGINT, as CPython does."""
    import atexit
    import threading
    import traceback

    interrupted = False
    try:
        code = entry()
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt:
        traceback.print_exc()
        code, interrupted = 1, True
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
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return (code or 0) & 0xFF


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


def run_console(request: dict[str, Any], report: str) -> None:
    """A console call's child: the script with files for its output. Never returns."""
    stdin = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    become(request["env"], request["cwd"], (stdin, out, err), unbuffered="PYTHONUNBUFFERED" in request["env"])
    set_threads(request["env"])
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    sys.argv = [request["argv0"], *request["args"]]
    watch_work(report)
    os._exit(exit_code_of(entry_of(request["script"])))


def run_proxied(request: dict[str, Any], streams: tuple[int, int, int]) -> None:
    """A proxy's child: `python [-u] -m MODULE ARGS` or `python SCRIPT ARGS`, as the interpreter runs
    it. Never returns."""
    env = request["env"]
    become(env, request["cwd"], streams, unbuffered=request["unbuffered"] or bool(env.get("PYTHONUNBUFFERED")))
    for signum in request["ignored"]:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, request["blocked"])
    set_threads(env)
    sys.orig_argv = request["orig_argv"]
    sys.modules["__main__"] = types.ModuleType("__main__")  # not the server's namespace
    if request["module"]:
        sys.path[:] = [os.getcwd(), *request["path"]]
        sys.argv = ["-m", *request["args"]]
    else:
        sys.path[:] = [os.path.dirname(os.path.realpath(request["script"])), *request["path"]]
        sys.argv = [request["script"], *request["args"]]
    code = exit_code_of(lambda: _run_main(request["module"], request["script"]))
    os._exit(code)


def _run_main(module: str, script: str) -> None:
    """`python -m MODULE` or `python SCRIPT`: runpy's own ways (their return value is not an exit code)."""
    if module:
        runpy._run_module_as_main(module)  # type: ignore[attr-defined] - what -m calls
    else:
        runpy.run_path(script, run_name="__main__")


# -- the server's side ---------------------------------------------------------------------------------


@dataclass
class Child:
    """A forked child and whom to tell when it ends: the console fixture (its work report) or a proxy."""

    report: str = ""  # a console call's work report file
    proxy: socket.socket | None = None


class Server:
    def __init__(self, path: str) -> None:
        self.children: dict[int, Child] = {}
        self.selector = selectors.PollSelector()  # no kernel object that a child would share (epoll)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(128)
        self.wakeup_read, wakeup_write = os.pipe()
        for fd in (self.wakeup_read, wakeup_write):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wakeup_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd is what wakes the loop
        self.own_fds = [self.listener.fileno(), self.wakeup_read, wakeup_write]
        self.stdin = io.BufferedReader(io.FileIO(0, "r", closefd=False))
        self.selector.register(0, selectors.EVENT_READ, self.console_request)
        self.selector.register(self.listener, selectors.EVENT_READ, self.accept)
        self.selector.register(self.wakeup_read, selectors.EVENT_READ, self.reap)
        self.open = True

    def loop(self) -> None:
        while self.open or self.children:
            for key, _ in self.selector.select(timeout=1.0):
                key.data(key.fileobj)
            self.reap(None)

    def fork(self, child: Child) -> int:
        """Fork with every signal blocked: one sent to the child before it has its parent's mask and
        dispositions (a proxy passes a signal on as soon as it knows the pid) waits until it has them."""
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        pid = os.fork()
        if pid == 0:
            for fd in self.own_fds + [c.proxy.fileno() for c in self.children.values() if c.proxy]:
                os.close(fd)
            return pid  # its mask is set by run_console or run_proxied
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        self.children[pid] = child
        return pid

    def console_request(self, _: Any) -> None:
        line = self.stdin.readline()
        if not line:  # the fixture closed: serve no more, end with the children left
            self.open = False
            self.selector.unregister(0)
            self.selector.unregister(self.listener)
            for pid in self.children:
                _kill_group(pid)
            return
        request = json.loads(line)
        report = request["stderr"] + ".work.json"
        pid = self.fork(Child(report=report))
        if pid == 0:
            run_console(request, report)  # never returns
        _reply({"pid": pid})

    def accept(self, _: Any) -> None:
        proxy, _ = self.listener.accept()
        try:
            proxy.settimeout(30)
            request, streams = _receive(proxy)
        except (OSError, ValueError) as exc:
            print(f"zygote: a proxy's request was refused: {exc}", file=sys.stderr, flush=True)
            proxy.close()
            return
        pid = self.fork(Child(proxy=proxy))
        if pid == 0:
            run_proxied(request, streams)  # never returns
        for fd in streams:
            os.close(fd)
        proxy.sendall(f"pid {pid}\n".encode())
        self.selector.register(proxy, selectors.EVENT_READ, lambda sock, pid=pid: self.proxy_gone(sock, pid))

    def proxy_gone(self, proxy: socket.socket, pid: int) -> None:
        """A proxy says nothing after its request: readable means it died (SIGKILL): so does its child."""
        self.selector.unregister(proxy)
        if pid in self.children:
            _kill_group(pid)

    def reap(self, _: Any) -> None:
        try:
            os.read(self.wakeup_read, 4096)
        except BlockingIOError:
            pass
        while self.children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            child = self.children.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            if child.proxy is not None:
                self.end_proxy(child.proxy, code)
            else:
                work = {"steps": 0, "process": ""}
                if os.path.exists(child.report):
                    with open(child.report) as file:
                        work = json.load(file)
                    os.unlink(child.report)
                _reply({"code": code, **work})

    def end_proxy(self, proxy: socket.socket, code: int) -> None:
        if proxy.fileno() in self.selector.get_map():
            self.selector.unregister(proxy)
        try:
            proxy.sendall(f"exit {code}\n".encode())
        except OSError:
            pass  # the proxy died first
        proxy.close()


def _receive(proxy: socket.socket) -> tuple[dict[str, Any], tuple[int, int, int]]:
    head, fds, _, _ = socket.recv_fds(proxy, HEADER.size, 3)
    if len(head) != HEADER.size or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"a header of {len(head)} bytes with {len(fds)} descriptors")
    (size,) = HEADER.unpack(head)
    body = b""
    while len(body) < size:
        chunk = proxy.recv(size - len(body))
        if not chunk:
            raise ValueError("the proxy closed before its request ended")
        body += chunk
    return json.loads(body), (fds[0], fds[1], fds[2])


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass  # gone already


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def serve(path: str) -> None:
    preload()
    gc.freeze()  # what is here now is never collected in a child: no copy of its pages
    server = Server(path)
    # Forking is safe while this process has one thread (torch starts its pools at the first parallel op).
    _reply({"threads": len(os.listdir("/proc/self/task"))})
    server.loop()


if __name__ == "__main__":
    serve(sys.argv[1])
