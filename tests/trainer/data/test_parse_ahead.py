"""Annotation files parsed while torch is imported (data/parse_ahead.py): the trainer reads the store the
child wrote instead of parsing again; nothing is written before the run is released, and nothing by a run
that ends first; one process of a node parses a file ahead; a file changed meanwhile is parsed again; it
starts only where it gains; and `train` uses it end to end."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from maskrcnn_dist.cli import main
from maskrcnn_dist.config import small_cpu_run, to_argv
from maskrcnn_dist.data import load_datasets, parse_ahead, write_train_val
from maskrcnn_dist.data.annotations import read
from maskrcnn_dist.data.annotations.read import open_store, read_store, samples_file
from maskrcnn_dist.data.parse_ahead import ParseAhead, released
from maskrcnn_dist.data.sources import resolve
from maskrcnn_dist.errors import DatasetError

from ..conftest import fast_config

_PARSED_S = 1.5  # ample for a child to parse a file of a dozen images


@pytest.fixture
def coco(tmp_path: Path) -> Path:
    root = tmp_path / "coco"
    write_train_val(root, num_train=12, num_val=4, seed=3, image_size=(48, 64), max_objects=3)
    return root


def _start(cfg, **kw) -> ParseAhead:
    parsing = parse_ahead.parse_ahead(cfg, worth_from_bytes=0, **kw)
    assert isinstance(parsing, ParseAhead)
    return parsing


def _no_parse_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process (and any child it forks from now on) refuses to parse: only a child forked before reads."""

    def refuse(path, kept=None):
        raise DatasetError(f"{path}: parsed by the trainer, not ahead")

    monkeypatch.setattr(read, "read_store", refuse)


def test_the_trainer_waits_for_the_store_parsed_ahead_and_does_not_parse_again(
    coco: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = fast_config(coco, tmp_path / "run")
    parsing = _start(cfg)
    assert parsing.files == (coco / "train" / "annotations.json", coco / "val" / "annotations.json")
    _no_parse_here(monkeypatch)
    time.sleep(_PARSED_S)
    assert not (tmp_path / "run").exists()  # parsed, and held until released
    # The train file's child cannot write for a second after its release: the trainer gets there first.
    holding = samples_file(coco / "train" / "annotations.json", tmp_path / "run" / "cache").writer_lock()
    holding.__enter__()
    threading.Timer(1.0, holding.__exit__, (None, None, None)).start()
    with caplog.at_level("INFO", logger="maskrcnn_dist.data.cache"), released(parsing):
        train_set, val_set = load_datasets(cfg)
    assert (len(train_set), len(val_set)) == (12, 4)
    assert [r.getMessage() for r in caplog.records if "cached while this process started" in r.getMessage()]
    monkeypatch.undo()
    for split in ("train", "val"):
        annotations = coco / split / "annotations.json"
        cache = samples_file(annotations, tmp_path / "run" / "cache")
        assert bytes(cache.read()) == b"".join(read_store(annotations).chunks())  # the trainer's own parse, bit for bit
        assert not cache.ahead_lock_path().exists()  # the child's lock file goes with the payload made


def test_a_run_that_ends_before_its_data_is_loaded_writes_nothing(coco: Path, tmp_path: Path) -> None:
    cfg = fast_config(coco, tmp_path / "run")
    parsing = _start(cfg)
    time.sleep(_PARSED_S)
    children = [child.pid for child in parsing._children]
    parsing.close()  # never released: a refused flag, a stop before the data
    for pid in children:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped
    assert not (tmp_path / "run").exists()
    _start(cfg).close()  # and its locks are free again


def test_a_child_mid_parse_is_killed_not_waited_for(
    coco: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parse_ahead, "read_store", lambda *_: time.sleep(3600))  # a parse far past any test
    parsing = _start(fast_config(coco, tmp_path / "run"))
    started = time.monotonic()
    parsing.close()
    assert time.monotonic() - started < 300  # killed at once (milliseconds); waited for, an hour
    assert not (tmp_path / "run").exists()


def test_one_process_of_a_node_parses_a_file_ahead(coco: Path, tmp_path: Path) -> None:
    cfg = fast_config(coco, tmp_path / "run")
    with _start(cfg):
        assert parse_ahead.parse_ahead(cfg, worth_from_bytes=0).files == ()  # another rank of the pod: it waits
    with _start(cfg):
        pass


def test_a_file_changed_while_parsed_ahead_is_parsed_again(coco: Path, tmp_path: Path) -> None:
    cfg = fast_config(coco, tmp_path / "run")
    annotations = coco / "train" / "annotations.json"
    parsing = _start(cfg)
    time.sleep(_PARSED_S)  # the child has read the file as it was
    data = json.loads(annotations.read_text())
    dropped = data["images"].pop()["id"]
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] != dropped]
    annotations.write_text(json.dumps(data))
    with released(parsing):
        train_set, _ = load_datasets(cfg)
    assert len(train_set) == 11
    assert len(open_store(annotations, tmp_path / "run" / "cache")) == 11  # and the cache says so too


def test_it_starts_only_where_it_gains(coco: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def starts(**flags) -> bool:
        cfg = fast_config(coco, tmp_path / "run", **flags)
        parsing = parse_ahead.parse_ahead(cfg, env=env, worth_from_bytes=0)
        if parsing is None:
            return False
        files = parsing.files
        parsing.close()
        return bool(files)

    env: dict[str, str] = {}
    assert parse_ahead.parse_ahead(fast_config(coco, tmp_path / "run")).files == ()  # small files: no gain
    assert starts()
    assert not starts(**{"test-only": True, "resume": tmp_path / "some.pt"})  # eval
    assert not starts(**{"data-cache": "off"})  # nowhere to write it
    assert not starts(**{"data-path": tmp_path / "nowhere"})  # the trainer refuses the flag
    assert not starts(engine="pipeline")  # no plan: the trainer says so
    env = {"PLAN": json.dumps("worker")}
    monkeypatch.setattr(parse_ahead.PodPlan, "from_env", classmethod(lambda cls, env: _Role(json.loads(env["PLAN"]))))
    assert not starts(engine="pipeline")  # a stage worker loads no data
    env = {"PLAN": json.dumps("master")}
    assert starts(engine="pipeline")
    env = {}
    monkeypatch.setattr(parse_ahead, "available_cores", lambda: 1)
    assert not starts()  # no core to parse on while torch loads
    monkeypatch.undo()
    for split in ("train", "val"):
        open_store(coco / split / "annotations.json", tmp_path / "run" / "cache")
    assert not starts()  # cached: nothing to parse


class _Role:
    def __init__(self, role: str) -> None:
        self.role = role


@pytest.mark.slow
def test_train_parses_ahead_end_to_end(coco: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """...and finds its splits once: the command line's, which the trainer takes (issue 55)."""
    monkeypatch.setattr(parse_ahead, "WORTH_FROM_BYTES", 0)
    found: list[Path] = []
    detect = resolve.detect
    monkeypatch.setattr(resolve, "detect", lambda root, announce=True: found.append(root) or detect(root, announce))
    flags = small_cpu_run(64, data_path=coco, output_dir=tmp_path / "run", max_steps=1, epochs=1, workers=0)
    with caplog.at_level("INFO", logger="maskrcnn_dist.data.cache"):
        result = CliRunner().invoke(main, ["train", *to_argv(flags)])
    assert result.exit_code == 0, result.output
    assert found == [coco]
    said = [r.getMessage() for r in caplog.records]
    assert not [line for line in said if "parsed annotations cached in" in line], said  # the trainer parsed nothing
    for split in ("train", "val"):
        assert samples_file(coco / split / "annotations.json", tmp_path / "run" / "cache").made_for_key()
