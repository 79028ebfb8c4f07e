"""The run around the steps: the loop and its hooks, and what they keep.

- `loop.py`: `Trainer`, the loop every engine shares (a batch, the engine's step, the position, the
  hooks), `HookBase`, and stopping at a step boundary with the due hooks pending;
- `hooks.py`: the hooks a run is made of (metrics, the grace check, validation, evaluation with the best
  checkpoint and patience, the periodic checkpoint), chosen by the composition root (train.py);
- `state.py`: the run's part of a checkpoint (position, pending hooks, RNG, every hook's state);
- `best.py`: the best value and the patience count (`BestTracker`), judged alike on every rank;
- `grace.py`: the pod's termination grace period against one step plus one checkpoint write;
- `metrics.py`: the metrics writer (JSON lines, TensorBoard, the console) and its sinks;
- `progress_post.py`: a sink that posts progress into a Kubeflow TrainJob's status.

Tools (outputs/, profile/) never import this package's loop; engines never import any of it.
"""
