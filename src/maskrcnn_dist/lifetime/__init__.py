"""A trainer process's lifetime: its cores, its group (elastic), and how it stops.

- `membership.py` and `elastic.py`: an elastic ddp group (who is in it, agreed through the job's TCPStore;
  survivors of a lost member go on in a new process group, a replacement joins, a drained member leaves);
- `cores.py`: how many cores the process may run on (torch-free);
- `heap.py`: the cyclic garbage collector paused around bulk bookkeeping (`gc_paused`);
- `stop.py`: the stop request on SIGTERM/SIGINT (made and installed once at the entry point, handed to
  the engines and the loop), `Stopped` and `Interrupted`, and the helper processes' detachment from the
  trainer's process group. The signals themselves are the launcher contract's (contract/signals.py).
"""
