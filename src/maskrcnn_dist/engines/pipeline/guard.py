"""The device-map guard: every RPC result (and pipeline request) of this process walked as TensorPipe
walks it with device maps.

An RPC agent that has devices (any device map) finds the CUDA tensors of every Python function's
result, and of every OwnerRRef's value, by pickling it: `Future::markCompleted` -> `extractStorages`
-> `PyObjectHolder::extractTensors` -> `torch._jit_internal._extract_tensors`. Whatever does not
pickle there (a lambda, a `threading.Condition`, a module with closures in its hooks) fails the call,
and only on a GPU: without devices nothing walks an RRef's value, so a pipeline that kept its stage
hosts in RRefs passed every CPU test and stopped at its first step on a GPU.

`installed()` makes this process do the same walk without a GPU. It wraps what every such result
comes from:
  * `torch.distributed.rpc.internal._run_function`, which runs the Python function an `rpc_sync`,
    `rpc_async` or `remote` names; its return value becomes the response, or the OwnerRRef's value
    (an `@rpc.functions.async_execution` function's future is walked when it completes);
  * `rpc.RRef(value)`, an OwnerRRef made locally.
Each result is walked by `torch._jit_internal._extract_tensors` itself, and then held to the kit's
stricter rule of what crosses the wire: tensors and small plain values. Pickled with its tensors
left out, a result must stay under `max_plain_bytes`, and it must hold neither a module, an optimizer
or a scheduler, nor what torch's walk skips without a look (a plain lock, a thread, a future): those
are a stage's machinery and state, not values. An error's result
(torch's RemoteException) is walked but not bounded: the guard must not hide the error it carries.

A result that fails is replaced by the error the agent would give, `DeviceMapGuardError`, naming the
function, the worker and the cause; the caller raises it. The pipeline sends its activations and
gradients in requests, which the sending agent walks the same way: `check_request` holds them to the
same rule before they are sent (hosts.send calls it while the guard is installed).

Installed before `rpc.init_rpc`: torch's Python RPC handler looks `_run_function` up when RPC starts
(python_rpc_handler.cpp) and keeps it until RPC shuts down. `runtime.join_rpc` installs it when
`MASKRCNN_DEVICE_MAP_GUARD` (contract.DEVICE_MAP_GUARD) is on, for the process's lifetime; the test
suite turns it on for every pipeline process (tests/conftest.py).
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed.rpc as rpc
import torch.distributed.rpc.internal as rpc_internal
from maskrcnn_launcher.contract import DEVICE_MAP_GUARD
from torch._jit_internal import _extract_tensors, is_rref_instance

from ...errors import ConfigError

#: A result's bytes without its tensors. The largest plain part the pipeline sends is a stage's
#: description or checkpoint part (their state dict keys): 15 KB for R50-FPN's first stage. Bulk data
#: as Python values (a tensor's `.tolist()`, a long string) is what the bound stops.
DEFAULT_MAX_PLAIN_BYTES = 256 * 1024
#: Objects that never cross, whatever their size: a stage's machinery stays on its worker.
_MACHINERY = (torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)

_ON, _OFF = ("1", "on", "true", "yes"), ("", "0", "off", "false", "no")


class DeviceMapGuardError(RuntimeError):
    """An RPC result that an agent with device maps could not send, or that is not tensors and small values."""


def enabled(env: Mapping[str, str] = os.environ) -> bool:
    """Whether `DEVICE_MAP_GUARD` asks for the guard; ConfigError naming the variable on any other value."""
    value = env.get(DEVICE_MAP_GUARD, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ConfigError(f"{DEVICE_MAP_GUARD}={value!r}: expected 1 (on) or 0 (off)")


class _PlainPickler(pickle.Pickler):
    """Pickles a result with its tensors (and RRefs, which travel by reference) left out; refuses a
    module, an optimizer or a scheduler."""

    def persistent_id(self, obj: Any) -> int | None:
        if isinstance(obj, _MACHINERY):
            raise TypeError(f"a {type(obj).__module__}.{type(obj).__qualname__} would cross")
        return 0 if isinstance(obj, torch.Tensor) or is_rref_instance(obj) else None


def plain_bytes(value: Any) -> int:
    """The bytes `value` pickles to without its tensors; raises what pickling raises."""
    buffer = io.BytesIO()
    _PlainPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.tell()


def check(value: Any, max_plain_bytes: int | None) -> None:
    """Raise DeviceMapGuardError unless an agent with devices could send `value` (torch's own walk)
    and, with a bound, `value` is tensors and at most `max_plain_bytes` of plain values."""
    try:
        tensors = _extract_tensors(value)
    except Exception as exc:
        raise DeviceMapGuardError(f"TensorPipe's tensor walk fails on it: {type(exc).__name__}: {exc}") from exc
    if any(t.is_cuda and t.numel() == 0 for t in tensors):
        # TensorPipe aborts the sending process on the null pointer of an empty CUDA tensor (tensorpipe#447).
        raise DeviceMapGuardError("it holds an empty CUDA tensor, which TensorPipe cannot send (tensorpipe#447)")
    if max_plain_bytes is None:
        return
    try:
        size = plain_bytes(value)
    except Exception as exc:
        raise DeviceMapGuardError(f"it holds machinery or state, not values: {type(exc).__name__}: {exc}") from exc
    if size > max_plain_bytes:
        raise DeviceMapGuardError(
            f"{size} bytes besides its tensors (bound {max_plain_bytes}): only tensors and small plain values cross"
        )


def _describe(python_udf: Any) -> str:
    func = getattr(python_udf, "func", None)
    name = getattr(func, "__qualname__", None) or type(func).__name__
    return f"{getattr(func, '__module__', '?')}.{name}"


def _worker() -> str:
    try:
        return rpc.get_worker_info().name
    except Exception:  # RPC not (or no longer) up: this process has no name
        return f"pid {os.getpid()}"


def _refuse(what: str, exc: DeviceMapGuardError, part: str = "result") -> DeviceMapGuardError:
    message = f"device-map guard on {_worker()}: the {part} of {what} cannot cross: {exc}"
    print(message, file=sys.stderr, flush=True)
    return DeviceMapGuardError(message)


def check_request(what: str, callee: str, args: Any, max_plain_bytes: int = DEFAULT_MAX_PLAIN_BYTES) -> None:
    """DeviceMapGuardError unless the arguments of a call of `what` on `callee` could cross: the pipeline
    sends activations and gradients in requests, which an agent with device maps walks as it walks results."""
    try:
        check(args, max_plain_bytes)
    except DeviceMapGuardError as exc:
        raise _refuse(f"a request of {what} to {callee}", exc, "arguments") from exc


def _checked(what: str, max_plain_bytes: int, future: torch.futures.Future) -> Any:
    value = future.wait()
    try:
        check(value, max_plain_bytes)
    except DeviceMapGuardError as exc:
        raise _refuse(what, exc) from exc
    return value


def _run_guarded(run_function: Callable[[Any], Any], max_plain_bytes: int, python_udf: Any) -> Any:
    """torch's `_run_function`, then the walk of what it returns, as the agent would walk it."""
    result = run_function(python_udf)
    what = _describe(python_udf)
    is_error = isinstance(result, rpc_internal.RemoteException)
    is_async = getattr(getattr(python_udf, "func", None), "_wrapped_async_rpc_function", None) is not None
    # torch._C.Future: what rpc_async returns (an async_execution function may return it as it is);
    # torch.futures.Future derives from it.
    if is_async and isinstance(result, torch._C.Future):
        return result.then(functools.partial(_checked, what, max_plain_bytes))
    try:
        check(result, None if is_error else max_plain_bytes)
    except DeviceMapGuardError as exc:
        refusal = _refuse(what, exc)
        return rpc_internal.RemoteException(f"{refusal}\n{traceback.format_exc()}", DeviceMapGuardError)
    return result


def _guarded_rref_init(init: Callable[..., None], max_plain_bytes: int) -> Callable[..., None]:
    @functools.wraps(init)
    def guarded_init(self: Any, value: Any, *args: Any, **kwargs: Any) -> None:
        try:
            check(value, max_plain_bytes)
        except DeviceMapGuardError as exc:
            raise _refuse("an RRef made here", exc) from exc
        init(self, value, *args, **kwargs)

    return guarded_init


def is_installed() -> bool:
    return isinstance(rpc_internal._run_function, functools.partial) and (
        rpc_internal._run_function.func is _run_guarded
    )


def install(max_plain_bytes: int = DEFAULT_MAX_PLAIN_BYTES) -> Callable[[], None]:
    """Guard this process's RPC results from now on (call before rpc.init_rpc); returns the undo."""
    if is_installed():
        raise RuntimeError("the device-map guard is installed in this process already")
    run_function = rpc_internal._run_function
    own_init = rpc.RRef.__dict__.get("__init__")  # None: RRef inherits PyRRef's
    rpc_internal._run_function = functools.partial(_run_guarded, run_function, max_plain_bytes)
    rpc.RRef.__init__ = _guarded_rref_init(rpc.RRef.__init__, max_plain_bytes)

    def uninstall() -> None:
        rpc_internal._run_function = run_function
        if own_init is None:
            del rpc.RRef.__init__
        else:
            rpc.RRef.__init__ = own_init

    return uninstall


def install_if_enabled(env: Mapping[str, str] = os.environ) -> bool:
    """Install the guard if `DEVICE_MAP_GUARD` asks for it and it is not installed yet; whether it is on."""
    if not enabled(env):
        return False
    if not is_installed():
        install()
    return True


@contextmanager
def installed(max_plain_bytes: int = DEFAULT_MAX_PLAIN_BYTES) -> Iterator[None]:
    """The guard for the body (which starts and shuts down RPC)."""
    uninstall = install(max_plain_bytes)
    try:
        yield
    finally:
        uninstall()
