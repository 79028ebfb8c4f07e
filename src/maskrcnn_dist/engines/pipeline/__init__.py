"""The `pipeline` engine: Mask R-CNN split into stages on RPC workers (torch.distributed.rpc).

stages.py     the one place that splits GeneralizedRCNN into StageModules; MicroBatchState flows between them
host.py       StageHost: one stage's replicas, optimizers and ordering, on its worker
engine.py     PipelineEngine: the master's micro-batch flow, loss reduction and step control
transport.py  device staging, bf16 features and byte counts at a stage's edges
state.py      replica checksums and optimizer states in the local engine's layout
runtime.py    RPC start-up and shut-down, the workers' master watchdog (train.py calls these)
"""

from .engine import PipelineEngine, split_batch, weighted_mean
from .host import StageHost
from .runtime import master_session, serve

__all__ = ["PipelineEngine", "StageHost", "master_session", "serve", "split_batch", "weighted_mean"]
