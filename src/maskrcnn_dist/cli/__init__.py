"""`maskrcnn-dist`: a thin click layer over the library (config/, train.py, data/, outputs/, profile/): the
group here, its options generated from the config (options.py), the commands by concern (run.py, data.py,
tools.py), registered in the order `--help` and docs/reference/flags.md list them."""

from __future__ import annotations

import logging
import os
import sys

import click
from maskrcnn_launcher.contract import GuardedGroup

from ..errors import classify as classify_error
from .data import check_data, synth_data
from .run import demo, eval_command, train
from .tools import export, predict, profile, report, status


def _setup_logging(verbose: bool) -> None:
    rank = os.environ.get("RANK")
    prefix = f"[rank {rank}] " if rank is not None else ""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@click.group(
    cls=GuardedGroup,
    classify=classify_error,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
)
@click.option("-v", "--verbose", is_flag=True, help="debug logging")
def main(verbose: bool) -> None:
    """Train torchvision's Mask R-CNN on one machine or several (ddp, pipeline)."""
    _setup_logging(verbose)


for command in (train, eval_command, synth_data, check_data, report, status, demo, profile, predict, export):
    main.add_command(command)
