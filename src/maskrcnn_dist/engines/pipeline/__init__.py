"""The `pipeline` engine: Mask R-CNN split into stages on RPC workers (torch.distributed.rpc).

stages.py     the one place that splits GeneralizedRCNN into StageModules; MicroBatchState flows between them
host.py       StageHost: one stage's replicas, optimizers, ordering and streams, on its worker
hosts.py      the hosts' RPC surface: each worker's registry, the functions called by name, the master's handle
streams.py    one CUDA stream per replica, ordered after the caller's and handed back to it
engine.py     PipelineEngine: the master's micro-batch flow, loss reduction and step control
transport.py  device staging, bf16 features and byte counts at a stage's edges
state.py      replica checksums and optimizer states in the local engine's layout
guard.py      the device-map guard: every RPC result walked as TensorPipe walks it with device maps
runtime.py    RPC start-up and shut-down, the workers' master watchdog (train.py calls these)
"""

from .engine import PipelineEngine, split_batch, weighted_mean
from .host import StageHost
from .runtime import master_session, serve

__all__ = ["PipelineEngine", "StageHost", "master_session", "serve", "split_batch", "weighted_mean"]
