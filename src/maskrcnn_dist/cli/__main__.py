"""`python -m maskrcnn_dist.cli`: what torchrun and the launcher start."""

from . import main

main()
