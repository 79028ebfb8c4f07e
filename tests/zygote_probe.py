"""`python -m zygote_probe WHAT` from the tests folder, or `python tests/zygote_probe.py WHAT`: a program
tests/zygote.py serves either way (tests/zygote_site/sitecustomize.py), for tests/test_zygote.py. It
prints what it is as one JSON line, then:
`exit N` exits N; `raise` raises; `interrupt` raises KeyboardInterrupt; `wait` stops on SIGTERM (says so
on stderr, exits 75) or ends after 60 s; `sleep` sleeps 60 s with SIGTERM's default action."""

import json
import os
import signal
import sys
import time

import torch

what = sys.argv[1]
blocked = sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
print(
    json.dumps(
        {
            "pid": os.getpid(),
            "argv": sys.argv,
            "cwd": os.getcwd(),
            "probe_env": os.environ.get("PROBE"),
            "threads": torch.get_num_threads(),
            "blocked": blocked,
            "sigusr2_ignored": signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN,
            "unbuffered": sys.stdout.write_through,
        }
    ),
    flush=True,
)
if what == "exit":
    sys.exit(int(sys.argv[2]))
elif what == "raise":
    raise RuntimeError("the probe raised")
elif what == "interrupt":
    raise KeyboardInterrupt
elif what == "wait":

    def stop(signum: int, _frame: object) -> None:
        print(f"probe: stopped by signal {signum}", file=sys.stderr, flush=True)
        sys.exit(75)

    signal.signal(signal.SIGTERM, stop)
    print("waiting", flush=True)
    time.sleep(60)
elif what == "sleep":
    print("sleeping", flush=True)
    time.sleep(60)
