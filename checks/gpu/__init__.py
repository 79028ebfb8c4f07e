"""`make gpu-check`: the GPU paths proven on the device in one prepared run of a few minutes.

The step's throughput against torchvision's loop (benchmarks/bench_gpu_step.py), the pipeline over
TensorPipe device maps, amp against fp32 from the same weights, ddp's process group, evaluation under
amp, checkpoints moved between device kinds. Each check runs in its own process with its own budget
(harness.py); catalog.py lists them in run order; `python -m checks.gpu` runs them.
"""
