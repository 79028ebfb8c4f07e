"""Every setting, once: `from maskrcnn_dist.config import X` for all of them.

- fields.py: the field machinery (`option`, `Bounds`, `FieldSpec`: one declaration per setting, one
  converter, one range check);
- sections.py: the sections' table (`DataConfig`, `ModelConfig`, `OptimConfig`, `PeersConfig`,
  `PipelineConfig`) and the values their choices allow;
- train_config.py: `TrainConfig`, the run's own settings over the sections, its combination rules,
  `FIELDS` and `BY_FLAG`;
- build.py: building a TrainConfig (defaults < recipe < YAML < flags), saving it, and turning flags
  back into an argv;
- tool_options.py: the options of the commands beside training (predict, report --gallery, export,
  profile) and the train flags they share;
- presets.py: the recipes, the small CPU run and the demo job.

Each module declares its public names in its `__all__`, once; this face star-imports every module and
composes `__all__` from theirs (tests/test_faces.py fails while a module or a name is left out, or a
private name is exported).
"""

# ruff: noqa: F403 -- the face re-exports each module's `__all__` (the names are listed once, there).
from . import build, fields, presets, sections, tool_options, train_config
from .build import *
from .fields import *
from .presets import *
from .sections import *
from .tool_options import *
from .train_config import *

__all__ = [
    *build.__all__,
    *fields.__all__,
    *presets.__all__,
    *sections.__all__,
    *tool_options.__all__,
    *train_config.__all__,
]
