"""A replica's lane (engines/pipeline/streams.py) orders its work after the caller's stream and hands the
result back to it; checked on CPU with streams that record the calls."""

from __future__ import annotations

import pytest
import torch

from maskrcnn_dist.engines.pipeline.streams import CudaStreams, Lane, NullStreams, streams_for

from .stream_recorder import CALLER, RecordingStreams

CPU = torch.device("cpu")


def test_a_visit_waits_for_the_caller_runs_on_the_lane_and_is_waited_for() -> None:
    streams = RecordingStreams()
    lane = Lane(CPU, streams)
    incoming = [torch.zeros(2), {"x": torch.ones(1)}]
    with lane.entered(incoming=incoming) as visit:
        streams.mark("work")
        result = visit.hand_back({"out": torch.zeros(3)})
    assert result["out"].shape == (3,)
    assert streams.log == [
        ("wait", "lane0", CALLER),  # the incoming tensors are ready on the caller's stream
        ("record_stream", "lane0"),  # each incoming tensor is used by the lane too
        ("record_stream", "lane0"),
        ("work", "lane0"),  # the work runs on the replica's stream
        ("record_stream", CALLER),  # the result is sent from the caller's stream
        ("record", "lane0"),
        ("wait_event", CALLER, "event@lane0"),  # whatever the caller does next comes after the work
    ]
    assert streams.current() == CALLER  # the caller's stream is current again


def test_a_visit_after_other_lanes_waits_for_each_of_them() -> None:
    streams = RecordingStreams()
    first, second, third = (Lane(CPU, streams) for _ in range(3))
    with first.entered(after=[second, third]):
        streams.mark("sum")
    assert streams.log[:4] == [
        ("wait", "lane0", CALLER),
        ("wait", "lane0", "lane1"),
        ("wait", "lane0", "lane2"),
        ("sum", "lane0"),
    ]


def test_the_caller_waits_for_the_lane_even_when_the_work_raises() -> None:
    streams = RecordingStreams()
    lane = Lane(CPU, streams)
    with pytest.raises(ValueError, match="stage failed"), lane.entered():
        streams.mark("work")
        raise ValueError("stage failed")
    assert streams.log[-2:] == [("record", "lane0"), ("wait_event", CALLER, "event@lane0")]
    assert streams.current() == CALLER


def test_each_device_kind_gets_its_streams() -> None:
    assert isinstance(streams_for(CPU), NullStreams)
    assert isinstance(streams_for(torch.device("cuda", 0)), CudaStreams)
    lane = Lane(CPU)  # a CPU replica's lane: every call does nothing, the work runs as it is
    with lane.entered(incoming=torch.ones(1)) as visit:
        assert visit.hand_back(torch.ones(1)).item() == 1.0


class UnorderedStreams(CudaStreams):
    """The mutation the CUDA test must catch: streams that never wait for each other."""

    def wait_stream(self, waiter, producer) -> None:
        return None

    def wait_event(self, stream, event) -> None:
        return None


def _visit_on_cuda(ops: CudaStreams, value: float) -> float:
    """A request's stream (as TensorPipe's pool gives one) that produces the incoming tensor late, a lane
    that computes on it late too, and the request's stream reading the result at once: the sum is right
    only if the lane waited for the request's stream and the request's stream for the lane."""
    device = torch.device("cuda", 0)
    request = torch.cuda.Stream(device)
    lane = Lane(device, ops)
    torch.cuda.synchronize(device)
    with torch.cuda.stream(request):
        torch.cuda._sleep(100_000_000)  # some 50 ms of the GPU: the incoming tensor is written after it
        incoming = torch.full((1 << 22,), value, device=device)
        with lane.entered(incoming=incoming) as visit:
            torch.cuda._sleep(100_000_000)
            result = visit.hand_back(incoming * 2)
        total = result.sum()
    torch.cuda.synchronize(device)
    return float(total)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_lane_and_the_request_stream_wait_for_each_other() -> None:
    assert _visit_on_cuda(CudaStreams(), 1.0) == 2.0 * (1 << 22)
    # Without the waits the same visit reads what is not written yet (another value: not the first's
    # memory either): the test can fail.
    assert _visit_on_cuda(UnorderedStreams(), 3.0) != 6.0 * (1 << 22)
