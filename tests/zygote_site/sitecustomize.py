"""The test suite's proxy for trainers (tests/zygote.py): Python imports this at start-up in every process
the suite starts (tests/conftest.py puts this folder on PYTHONPATH). In a process started as `python
[-u] -m maskrcnn_dist.cli ...`, as the `maskrcnn-dist` script or as one of the suite's programs that
run the trainer's parts (SERVED_TEST_SCRIPTS), by this interpreter, while the server
runs (MASKRCNN_TEST_ZYGOTE), it hands the server its argv, environment, folder, signal mask, ignored
signals and standard streams, then stands in for the child forked there: the signals sent to it go to
the child, and it ends as the child ended. Anything else (another program, another flag, an extra open
descriptor, no server) runs as it is. Standard library only, and nothing at all imported for the rest."""

import os
import sys

SERVED_MODULES = ("maskrcnn_dist.cli", "zygote_probe")  # the trainer, and tests/test_zygote.py's probe
SERVED_SCRIPTS = ("maskrcnn-dist",)  # beside the interpreter
# The suite's own programs that run the trainer's parts (beside tests/zygote_site in the tests folder).
SERVED_TEST_SCRIPTS = (
    "pipeline_procs.py",
    "guard_calls.py",
    "ddp_equivalence_proc.py",
    "sync_bn_proc.py",
    "elastic_member.py",
    "zygote_probe.py",  # tests/test_zygote.py's
)
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGCONT", "SIGWINCH")


def _served(argv: list) -> dict | None:
    """What the server runs for this command line, or None for one it does not serve."""
    words = argv[1:]
    unbuffered = False
    while words and words[0] == "-u":
        unbuffered, words = True, words[1:]
    if len(words) >= 2 and words[0] == "-m" and words[1] in SERVED_MODULES:
        return {"module": words[1], "script": "", "args": words[2:], "unbuffered": unbuffered}
    if words and _served_script(words[0]):
        return {"module": "", "script": words[0], "args": words[1:], "unbuffered": unbuffered}
    return None


def _served_script(word: str) -> bool:
    folder, name = os.path.split(os.path.abspath(word))
    if name in SERVED_SCRIPTS:
        return folder == os.path.dirname(sys.executable)
    return name in SERVED_TEST_SCRIPTS and (folder + os.sep).startswith(TESTS + os.sep)


def _only_standard_streams() -> bool:
    """No descriptor beyond 0-2 is passed on (the child gets those three), and all three are open."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            inheritable = os.get_inheritable(fd)
        except OSError:  # listdir's own descriptor, closed by now
            continue
        if fd > 2 and inheritable:
            return False
    try:
        for fd in (0, 1, 2):
            os.fstat(fd)
    except OSError:
        return False
    return True


def _proxy(path: str, served: dict) -> None:
    import json
    import signal
    import socket
    import struct

    forwarded = {getattr(signal, name) for name in FORWARDED}
    ignored = [s for s in forwarded if signal.getsignal(s) is signal.SIG_IGN]
    forwarded -= set(ignored)  # an ignored signal stays ignored, in the child too
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, forwarded)  # until the child's pid is known
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:  # no server (a test that ended it): run as it is
        sock.close()
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return
    request = {
        **served,
        "orig_argv": sys.orig_argv,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "path": sys.path,
        "blocked": sorted(int(s) for s in blocked),
        "ignored": sorted(int(s) for s in ignored),
    }
    body = json.dumps(request).encode()
    socket.send_fds(sock, [struct.pack("!I", len(body))], [0, 1, 2])
    sock.sendall(body)
    replies = sock.makefile("rb")
    pid = int(replies.readline().split()[1])

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(pid, signum)
        except OSError:
            pass  # it ended: its exit is on its way

    for signum in forwarded:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, forwarded)
    line = replies.readline()
    if not line:
        os.write(2, b"tests/zygote_site: the zygote server went away before this process's child ended\n")
        os._exit(1)
    code = int(line.split()[1])
    if code < 0:  # killed by a signal: so is this process, as its parent expects
        signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {-code})
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)


def _main() -> None:
    path = os.environ.get("MASKRCNN_TEST_ZYGOTE")
    if not path or os.environ.get("MASKRCNN_TEST_ZYGOTE_PYTHON") != sys.executable:
        return
    served = _served(list(getattr(sys, "orig_argv", [])))
    if served is not None and _only_standard_streams():
        _proxy(path, served)


_main()
