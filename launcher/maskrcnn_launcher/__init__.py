"""maskrcnn_launcher: topology + pod identity -> a pod plan; waits for peers; execs the trainer.

This package never imports torch: it runs in small init steps and before the trainer exists.
The environment contract (variable names and the `PodPlan` record) lives in `contract.py`.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
