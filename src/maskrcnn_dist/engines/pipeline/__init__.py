"""The `pipeline` engine: Mask R-CNN split into stages on RPC workers (torch.distributed.rpc).

host.py       StageHost: one stage's replicas, optimizers and ordering, on its worker
engine.py     PipelineEngine: the master's micro-batch flow, loss reduction and step control
transport.py  device staging, bf16 features and byte counts at a stage's edges
state.py      replica checksums and optimizer states in the local engine's layout
runtime.py    RPC start-up, the workers' master watchdog, run_pipeline (the CLI's entry)
"""

from .engine import PipelineEngine, split_batch, weighted_mean
from .host import StageHost, StageSpec
from .runtime import master_session, run_pipeline, run_pipeline_from_env, serve

__all__ = [
    "PipelineEngine",
    "StageHost",
    "StageSpec",
    "master_session",
    "run_pipeline",
    "run_pipeline_from_env",
    "serve",
    "split_batch",
    "weighted_mean",
]
