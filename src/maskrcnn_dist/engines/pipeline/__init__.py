"""The `pipeline` engine: Mask R-CNN split into stages on RPC workers, over plain torch.distributed.rpc calls
that carry every tensor by value (device maps move CUDA tensors): no RRef, no distributed autograd.

stages.py     the one place that splits GeneralizedRCNN into StageModules; MicroBatchState flows between them
schedule.py   GPipe and 1F1B: the order of a stage's forwards and backwards
rounds.py     one step on one stage: turns in the schedule's order, what a micro-batch keeps until its backward
host.py       StageHost: one stage's replicas, forward and stage-by-stage backward, on its worker
replica.py    a replica: modules, optimizer, scheduler, stream; built from the same seed as the local engine
update.py     the step's two phases on a stage (replica sums, unscale and check; optimizer), checkpoint parts
hosts.py      the hosts' RPC surface: each worker's registry, the functions called by name, the handles
streams.py    one CUDA stream per replica, ordered after the caller's and handed back to it
engine.py     PipelineEngine: the master's micro-batch flow, the step's agreement, checkpoints
micro.py      the master's micro-batches: split, losses weighed, precisions allowed
scaler.py     fp16's loss scale across stages, kept by the master (GradScaler's arithmetic and state)
transport.py  activations and gradients by value, each replica's route over an edge, byte counts
state.py      replica checksums and optimizer states in the local engine's layout
guard.py      the device-map guard: every RPC result and request walked as TensorPipe walks it with device maps
runtime.py    RPC start-up and shut-down, the workers' master watchdog (train.py calls these)
"""

from .engine import PipelineEngine
from .host import StageHost
from .micro import split_batch, weighted_mean
from .runtime import master_session, serve

__all__ = ["PipelineEngine", "StageHost", "master_session", "serve", "split_batch", "weighted_mean"]
