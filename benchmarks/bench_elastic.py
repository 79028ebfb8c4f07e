"""What decided the elastic ddp group's mechanism (docs/elastic.md): gloo and the TCPStore on loopback.

    .venv/bin/python benchmarks/bench_elastic.py [--ranks 6] [--state-mb 355] [--frozen-timeout 3] [--json F]

Each row is measured in this run, with real processes (spawned) around one TCPStore, as a ddp job's:
  killed peer     SIGKILL to one of 3 ranks; seconds until the survivors' next all-reduce raises
  cascade keep    the same with --ranks ranks, each survivor keeping its failed group (HOLD_S): the last
                  survivor released, hop by hop as its neighbours exit
  cascade inside  each survivor dropping its group inside the except block: the exception keeps torch's
                  frames, which hold the group and its sockets, so it is the same as keeping it
  cascade after   each survivor dropping its group once the except block has ended
  frozen peer     SIGSTOP to one of 3 ranks (a node gone without a reset) while the others' abort() runs
                  from a thread: seconds until the all-reduce returns (gloo's own timeout, --frozen-timeout)
  new group       init of a ProcessGroupGloo of 2 through the store under a fresh prefix
  store op        one TCPStore `add` round trip (median of 200)
  state           --state-mb of float32 broadcast over a gloo group of 2 (R50-FPN Mask R-CNN and its
                  SGD momentum: 355 MB)
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import statistics
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from maskrcnn_launcher.peers import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def _store(port: int, master: bool = False) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=master, timeout=timedelta(seconds=60), wait_for_workers=False)


def _loss_member(rank: int, world: int, port: int, drop: str, frozen: bool, timeout_s: float, out: Any) -> None:
    store = _store(port)
    prefix = dist.PrefixStore("g0", store)
    dist.init_process_group("gloo", store=prefix, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    tensor = torch.ones(1_000_000)
    dist.all_reduce(tensor)
    store.set(f"ready/{rank}", "1")
    if rank == world - 1:
        time.sleep(3600)  # the victim: killed or stopped by the parent
    store.wait(["hit"])
    hit = float(store.get("hit"))
    if frozen:
        threading.Timer(0.2, dist.distributed_c10d._get_default_group().abort).start()
    try:
        dist.all_reduce(tensor)
    except RuntimeError:
        out.put((rank, time.time() - hit))
        if drop == "inside":  # the exception, and torch's frames that hold the group, still alive
            _drop()
            time.sleep(HOLD_S)
    if drop == "after":
        _drop()
    time.sleep(HOLD_S)  # this process's sockets stay open now unless the group was dropped
    store.set(f"done/{rank}", "1")


HOLD_S = 3.0


def _drop() -> None:
    dist.destroy_process_group()
    gc.collect()


def time_loss(world: int, drop: str, frozen: bool = False, timeout_s: float = 60.0) -> float:
    """Seconds from the victim's SIGKILL (SIGSTOP when `frozen`) until the last survivor's all-reduce raised."""
    port = free_port()
    store = _store(port, master=True)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    args = (world, port, drop, frozen, timeout_s, out)
    procs = [ctx.Process(target=_loss_member, args=(r, *args)) for r in range(world)]
    for proc in procs:
        proc.start()
    try:
        store.wait([f"ready/{r}" for r in range(world)], timedelta(seconds=120))
        time.sleep(0.3)
        os.kill(procs[-1].pid, signal.SIGSTOP if frozen else signal.SIGKILL)
        store.set("hit", repr(time.time()))
        store.wait([f"done/{r}" for r in range(world - 1)], timedelta(seconds=timeout_s + 60))
        return max(out.get()[1] for _ in range(world - 1))
    finally:
        for proc in procs:
            proc.kill()
            proc.join()


def _pair_member(rank: int, port: int, state_mb: float, out: Any) -> None:
    store = _store(port)
    started = time.perf_counter()
    group = dist.ProcessGroupGloo(dist.PrefixStore("g1", store), rank, 2, timedelta(seconds=60))
    group.allreduce([torch.ones(1)]).wait()
    formed = time.perf_counter() - started
    times = []
    for _ in range(200):
        started = time.perf_counter()
        store.add(f"count/{rank}", 1)
        times.append(time.perf_counter() - started)
    state = torch.zeros(int(state_mb * 2**20 / 4))
    group.barrier().wait()
    started = time.perf_counter()
    group.broadcast(state, 0).wait()
    sent = time.perf_counter() - started
    out.put((rank, formed, statistics.median(times), sent))


def time_pair(state_mb: float) -> tuple[float, float, float]:
    """(seconds to form a group of 2, seconds per store op, seconds to send the state), the slower rank's."""
    port = free_port()
    _server = _store(port, master=True)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_pair_member, args=(r, port, state_mb, out)) for r in range(2)]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=300) for _ in procs]
    for proc in procs:
        proc.join()
    return tuple(max(r[i] for r in results) for i in (1, 2, 3))  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=6, help="ranks of the cascade rows")
    parser.add_argument("--state-mb", type=float, default=355.0, help="MB of state sent to a newcomer")
    parser.add_argument("--frozen-timeout", type=float, default=3.0, help="gloo timeout of the frozen-peer row")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args()
    formed, store_op, sent = time_pair(args.state_mb)
    rows = [
        ("killed peer, 3 ranks", f"{time_loss(3, drop='keep'):.3f} s"),
        (f"cascade keep, {args.ranks} ranks", f"{time_loss(args.ranks, drop='keep'):.3f} s"),
        (f"cascade drop inside except, {args.ranks} ranks", f"{time_loss(args.ranks, drop='inside'):.3f} s"),
        (f"cascade drop after except, {args.ranks} ranks", f"{time_loss(args.ranks, drop='after'):.3f} s"),
        (
            f"frozen peer, abort() at 0.2 s, timeout {args.frozen_timeout:g} s",
            f"{time_loss(3, drop='keep', frozen=True, timeout_s=args.frozen_timeout):.3f} s",
        ),
        ("new group of 2 through the store", f"{1000 * formed:.1f} ms"),
        ("store op (add)", f"{1000 * store_op:.3f} ms"),
        (f"state of {args.state_mb:g} MB to a newcomer", f"{sent:.3f} s"),
    ]
    report = {"torch": torch.__version__, "rows": dict(rows), "host": common.cpu_isa()}
    common.emit(common.render_table(("what", "figure"), rows, right_from=1), report, args.json)


if __name__ == "__main__":
    main()
