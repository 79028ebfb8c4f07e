"""contract.signals: the stop signals named once, and the one way to take signals for a block."""

from __future__ import annotations

import os
import signal

import pytest
from maskrcnn_launcher.contract import FORWARDED_STOP, STOP_SIGNALS, signal_handlers


def _record(received: list[int]):
    return lambda signum, _frame: received.append(signum)


def test_the_stop_signals_and_the_forward_are_the_trainer_s() -> None:
    assert STOP_SIGNALS == (signal.SIGTERM, signal.SIGINT)
    assert FORWARDED_STOP == signal.SIGUSR1 and FORWARDED_STOP not in STOP_SIGNALS


def test_handlers_are_installed_for_the_block_and_the_previous_ones_restored() -> None:
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGUSR1, signal.SIGUSR2)}
    received: list[int] = []
    handler = _record(received)
    with signal_handlers(dict.fromkeys(before, handler)):
        assert all(signal.getsignal(signum) is handler for signum in before)
        os.kill(os.getpid(), signal.SIGUSR2)  # Python runs the handler at the next bytecode
    assert received == [signal.SIGUSR2]
    assert {signum: signal.getsignal(signum) for signum in before} == before


def test_the_previous_handlers_come_back_when_the_block_raises() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    with pytest.raises(RuntimeError, match="in the block"):
        with signal_handlers({signal.SIGUSR2: signal.SIG_IGN}):
            assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
            raise RuntimeError("in the block")
    assert signal.getsignal(signal.SIGUSR2) == before


def test_keep_leaves_the_handlers_installed_after_the_block() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    received: list[int] = []
    handler = _record(received)
    try:
        with signal_handlers({signal.SIGUSR2: handler}, keep=lambda: True):
            pass
        assert signal.getsignal(signal.SIGUSR2) is handler
    finally:
        signal.signal(signal.SIGUSR2, before)
    with signal_handlers({signal.SIGUSR2: handler}, keep=lambda: bool(received)):
        pass  # nothing came: given back
    assert signal.getsignal(signal.SIGUSR2) == before
