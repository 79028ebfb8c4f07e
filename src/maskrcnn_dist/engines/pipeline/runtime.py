"""Process lifetime of the pipeline: joining the RPC group, serving, watching the master, leaving.

Failure rules (docs/architecture.md: any process that loses a peer exits non-zero within a bounded time):
  * master: RPC errors become PeerLostError naming the worker (engine.py); it then leaves RPC
    without the graceful barrier, which would wait for the dead worker forever.
  * worker: a graceful rpc.shutdown() waits for the master however long it takes. A watchdog
    thread polls the master's TCP store (the RPC rendezvous store, served by the master process):
    if the store stops answering before the master has written "done", the master is gone and
    the worker exits with status 1 and a message saying so.

Device-map guard (guard.py): with `MASKRCNN_DEVICE_MAP_GUARD=1` every process walks each of its RPC results as
TensorPipe does with device maps; `join_rpc` installs it before RPC starts, for the process's lifetime.

Stop rules (stop.py): a worker that gets SIGTERM/SIGINT keeps serving and tells the master (`StopForwarder`,
an ordinary RPC); the master stops at its next step boundary, writes the checkpoint, tells every worker
that the session ends on a stop, and shuts RPC down gracefully; then every process exits 75. Those RPC
calls reach the process's stop request through `RPC_STOP`, where the one who owns the request registers
it for the session's lifetime (`master_session`, `serve`); a call that finds none registered (the session
over, or never begun) is dropped: no session, nothing to stop.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import timedelta

import torch.distributed as dist
import torch.distributed.rpc as rpc
from maskrcnn_launcher.contract import PodPlan

from ...config import TrainConfig
from ...lifetime.stop import Stopped, StopRequest
from .engine import MASTER
from .guard import install_if_enabled

log = logging.getLogger(__name__)

DONE_KEY = "maskrcnn_dist/pipeline/done"
LEFT_KEY = "maskrcnn_dist/pipeline/left/"  # + a worker's name: it is out of RPC's graceful shutdown


def backend_options(cfg: TrainConfig, plan: PodPlan) -> rpc.TensorPipeRpcBackendOptions:
    options = rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://{plan.master_addr}:{plan.master_port}",
        rpc_timeout=cfg.peers.timeout,
        # Every in-flight micro-batch holds a thread while it waits for its turn (host.py).
        num_worker_threads=max(16, 4 * cfg.pipeline.micro_batches + 8),
        # Host-staged tensors go over TCP (uv), which is what crosses machines anyway. On one host
        # TensorPipe would pick its shared-memory transport, whose reactor busy-polls: on a few
        # shared cores that steals the CPU the stages need (measured on 2 busy cores: the stages' CPU
        # time per step is about halved with uv). With device maps TensorPipe keeps its defaults.
        _transports=["uv"] if plan.transport != "device_maps" else None,
    )
    if plan.transport == "device_maps":  # opt-in: device tensors cross workers without host staging
        for callee, mapping in plan.device_maps.items():
            options.set_device_map(callee, mapping)
    return options


class RpcStop:
    """The stop request that peers' RPC calls to this process reach (`_stop_requested` on the master,
    `_session_stopped` on a worker): registered by whoever owns it, for as long as its session runs. An
    RPC handler runs on one of RPC's threads and is named by its module-level function, so this is the
    one place it can look; nothing else is kept here."""

    def __init__(self) -> None:
        self._request: StopRequest | None = None

    @contextmanager
    def registered(self, stop: StopRequest) -> Iterator[StopRequest]:
        """`stop` reachable by peers for the body; a process runs one session at a time."""
        if self._request is not None:
            raise RuntimeError("a stop request is registered for RPC already: one session at a time")
        self._request = stop
        try:
            yield stop
        finally:
            self._request = None

    @property
    def request(self) -> StopRequest | None:
        """The registered request; None while no session runs here."""
        return self._request


#: This process's registration; the sessions below register their request here.
RPC_STOP = RpcStop()


def _store_client(plan: PodPlan, timeout: float) -> dist.TCPStore:
    return dist.TCPStore(plan.master_addr, plan.master_port, is_master=False, timeout=timedelta(seconds=timeout))


class Poller:
    """A worker's daemon thread that polls something every `period_s` seconds (`_watch`, waiting on
    `_stop` between polls) until `stop()`."""

    def __init__(self, name: str, period_s: float) -> None:
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=name, daemon=True)

    def start(self) -> Poller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        raise NotImplementedError


class MasterWatchdog(Poller):
    """On a worker: exit(1) once the master's store stops answering before it said "done"."""

    def __init__(self, plan: PodPlan, period_s: float, timeout_s: float) -> None:
        super().__init__("master-watchdog", period_s)
        self.plan, self.timeout_s = plan, timeout_s

    def _watch(self) -> None:
        try:
            store = _store_client(self.plan, self.timeout_s)
            while not self._stop.wait(self.period_s):
                if store.check([DONE_KEY]):
                    return  # the master is shutting down normally; rpc.shutdown() will return
        except Exception as exc:  # connection refused/reset: the master process is gone
            # ... or it finished normally just before our main thread's rpc.shutdown() returned:
            # give that one more period to stop us.
            if self._stop.wait(self.period_s):
                return
            print(
                f"error: {self.plan.rpc_name}: master lost ({self.plan.master_addr}:{self.plan.master_port} "
                f"stopped answering: {exc}); exiting",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)


# torch's RPC gathers objects over the ProcessGroupGloo it makes for itself, and then warns about that
# very use ("... as a ProcessGroup. This usage is deprecated since PyTorch 2.0"), twice per process: not
# ours to fix, nor the user's. Filtered around the kit's own RPC calls only, by this message alone.
GLOO_AS_PROCESS_GROUP = r"You are using a Backend <class '[\w.]*ProcessGroupGloo'> as a ProcessGroup"


@contextmanager
def torch_rpc_warning_filtered() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=GLOO_AS_PROCESS_GROUP)
        yield


def _shutdown(graceful: bool) -> None:
    try:
        with torch_rpc_warning_filtered():
            rpc.shutdown(graceful=graceful)
    except Exception as exc:  # a peer may already be gone; nothing is left to save
        log.warning("rpc shutdown: %s", exc)


def join_rpc(cfg: TrainConfig, plan: PodPlan, name: str, rank: int) -> None:
    """rpc.init_rpc, bounded: torch's rendezvous waits up to 30 minutes for a peer that never comes
    (a pending pod, a wrong address); after --join-timeout this process exits 1 saying so."""
    timeout = cfg.peers.join_timeout
    if install_if_enabled():  # before init_rpc: torch's handler looks up the function it wraps when RPC starts
        log.info("%s: device-map guard on: every RPC result walked as TensorPipe walks it", name)

    def give_up() -> None:
        print(
            f"error: {name}: the pipeline group ({plan.world_size} processes, master "
            f"{plan.master_addr}:{plan.master_port}) did not form within --join-timeout {timeout:g}s; exiting",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)

    timer = threading.Timer(timeout, give_up)
    timer.daemon = True
    timer.start()
    try:
        with torch_rpc_warning_filtered():
            rpc.init_rpc(name, rank=rank, world_size=plan.world_size, rpc_backend_options=backend_options(cfg, plan))
    finally:
        timer.cancel()


@contextmanager
def master_session(cfg: TrainConfig, plan: PodPlan, stop: StopRequest | None = None) -> Iterator[None]:
    """RPC as "master" (rank 0) for the body, `stop` (the engine's) registered for the workers' stop
    requests from before RPC opens until it is shut (None: nothing registered, a worker's stop is
    dropped); graceful exit tells the workers we are done first (and, after a stop, that it was one:
    they exit 75 too)."""
    with RPC_STOP.registered(stop) if stop is not None else nullcontext():
        join_rpc(cfg, plan, MASTER, 0)
        try:
            yield
        except Stopped as stopped:
            for name in dict.fromkeys(stage.rpc_name for stage in plan.stages):
                try:
                    rpc.rpc_sync(name, _session_stopped, args=(stopped.request.saved,), timeout=cfg.peers.timeout)
                except Exception as exc:  # a worker that is gone has nothing to be told
                    log.warning("could not tell %s that the session stopped: %s", name, exc)
            _end_session(cfg, plan)
            raise
        except BaseException:
            _shutdown(graceful=False)  # the barrier would wait for a dead peer
            raise
        _end_session(cfg, plan)


def _end_session(cfg: TrainConfig, plan: PodPlan) -> None:
    store = _store_client(plan, cfg.peers.timeout)
    store.set(DONE_KEY, "1")
    _shutdown(graceful=True)
    # RPC's graceful shutdown ends with rounds of call counts through the store this process serves: a
    # worker may still read the last one. Wait (bounded) until every worker is out before this process,
    # and with it the store, can go.
    workers = dict.fromkeys(stage.rpc_name for stage in plan.stages)
    try:
        store.wait([LEFT_KEY + name for name in workers], timedelta(seconds=min(cfg.peers.timeout, 30.0)))
    except Exception as exc:  # a worker that died meanwhile: its watchdog's business, not ours
        log.warning("not every worker said it left RPC: %s", exc)


def serve(cfg: TrainConfig, plan: PodPlan, stop: StopRequest | None = None) -> None:
    """A stage worker: join RPC, host whatever the master builds here, return when it is done; Stopped
    when the master ended the session on a stop. The composition root (train.py) has set up the process
    (threads, denormal flushing); the entry point installed `stop`, registered here for the master's calls
    from before this process joins RPC until it is out (None: a plain one, which only the master asks)."""
    stop = stop if stop is not None else StopRequest()
    with RPC_STOP.registered(stop):
        join_rpc(cfg, plan, plan.rpc_name, plan.rank)
        period = max(0.2, min(2.0, cfg.peers.timeout / 10))
        watchdog = MasterWatchdog(plan, period, cfg.peers.timeout).start()
        forwarder = StopForwarder(stop, plan.rpc_name, cfg.peers.timeout).start()
        with torch_rpc_warning_filtered():
            rpc.shutdown(graceful=True)  # serves the master's requests until it shuts down too
        forwarder.stop()
        watchdog.stop()
    try:
        _store_client(plan, cfg.peers.timeout).set(LEFT_KEY + plan.rpc_name, "1")  # the master may go now
    except Exception as exc:  # the master is gone already
        log.debug("%s: could not say it left: %s", plan.rpc_name, exc)
    if stop.done:  # the master ended the session on a stop, and said so (_session_stopped)
        raise Stopped(stop)
    log.info("%s: master finished, exiting", plan.rpc_name)


class StopForwarder(Poller):
    """On a worker: once this process is asked to stop, tell the master (the worker keeps serving: the
    master finishes the step and gathers the checkpoint from it). Polls the flag: a signal handler must
    not make an RPC call itself (it runs wherever the main thread was, maybe inside RPC's own locks)."""

    def __init__(self, stop: StopRequest, name: str, timeout_s: float, period_s: float = 0.1) -> None:
        super().__init__("stop-forwarder", period_s)
        self.request, self.name, self.timeout_s = stop, name, timeout_s

    def _watch(self) -> None:
        while not self._stop.wait(self.period_s):
            if self.request.done:
                return  # the master told us first: it is stopping already
            if self.request.requested:
                try:
                    rpc.rpc_sync(MASTER, _stop_requested, args=(self.name, self.request.reason), timeout=self.timeout_s)
                    log.info("%s: %s: the master stops at its next step boundary", self.name, self.request.reason)
                except Exception as exc:  # the master is gone or going: its watchdog ends this process
                    log.warning("%s: could not pass the stop to the master: %s", self.name, exc)
                return


def _stop_requested(worker: str, reason: str) -> None:
    """On the master, called by a worker: a stop was asked for there (dropped when no session runs here)."""
    if (stop := RPC_STOP.request) is None:
        log.debug("a stop from %s (%s) with no session here: dropped", worker, reason)
        return
    stop.request(f"{reason} on {worker}")


def _session_stopped(saved: str) -> None:
    """On a worker, called by the master after writing the stop's checkpoint: the session ends on a stop
    (dropped when no session runs here)."""
    if (stop := RPC_STOP.request) is None:
        log.debug("the master's stop (%s) with no session here: dropped", saved)
        return
    stop.request("the master's stop")
    stop.finish(f"the master's {saved}")
