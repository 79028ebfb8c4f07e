"""`python -m checks.gpu.preflight`: before the check runs on a python the kit did not install (a GPU
image's own torch), the trainer's other imports must be there; one line names what is missing."""

from __future__ import annotations

import importlib.util
import sys

# The trainer's and the launcher's dependencies besides torch and torchvision (pyproject.toml), by import name.
NEEDED = {
    "pycocotools": "pycocotools",
    "msgspec": "msgspec",
    "click": "click",
    "yaml": "pyyaml",
    "numpy": "numpy",
    "PIL": "pillow",
    "tensorboard": "tensorboard",
    "matplotlib": "matplotlib",
}


def missing() -> list[str]:
    return [package for module, package in NEEDED.items() if importlib.util.find_spec(module) is None]


def main() -> int:
    if absent := missing():
        print(
            f"gpu-check: {sys.executable} lacks {', '.join(absent)}: pip install {' '.join(absent)} "
            "(or put their wheels' folder on PYTHONPATH)",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
