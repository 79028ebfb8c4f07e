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
