"""What a training sample goes through before the model: the flip (flip.py), multiscale or lsj
(augment.py), copy-paste at batch level (copy_paste.py). Invariant: every draw is a function of the
seed, the epoch and the image, never of a generator's state."""
