"""maskrcnn_launcher: topology + pod identity -> a pod plan; waits for peers; execs the trainer.

This package never imports torch: it runs in small init steps and before the trainer exists.
The environment contract (variable names, the `PodPlan` record, the shared decisions) lives in `contract/`.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
