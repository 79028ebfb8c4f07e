"""Every setting, once: `from maskrcnn_dist.config import X` for all of them.

- fields.py: the field machinery (`option`, `Bounds`, `FieldSpec`: one declaration per setting, one
  converter, one range check);
- train_config.py: the train table (`TrainConfig` and its sections, `FIELDS`, `BY_FLAG`) and building it
  (defaults < YAML < flags), saving it, and turning flags back into an argv;
- tool_options.py: the options of the commands beside training (predict, report --gallery, profile) and
  the train flags they share;
- presets.py: the small CPU run and the demo job.
"""

from .fields import INT64_MAX, Bounds, FieldSpec, field_specs, option
from .presets import demo_flags, small_cpu_run
from .tool_options import (
    GALLERY_MAX,
    PREDICT_BY_FLAG,
    PREDICT_FIELDS,
    PREDICT_TRAIN_FLAGS,
    PROFILE_BY_FLAG,
    PROFILE_FIELDS,
    PROFILE_TRAIN_FLAGS,
    PredictConfig,
    ProfileConfig,
    build_predict_config,
    build_profile_config,
)
from .train_config import (
    AMP_DTYPES,
    BACKBONE_NORMS,
    BY_FLAG,
    CHECK_MODES,
    DEVICES,
    ENGINES,
    EXIF_ORIENTATIONS,
    FIELDS,
    MODEL_NAMES,
    DataConfig,
    ModelConfig,
    OptimConfig,
    PeersConfig,
    PipelineConfig,
    TrainConfig,
    apply_overrides,
    build_config,
    config_to_dict,
    fp16_on_cpu_problem,
    load_yaml_config,
    saved_model_flags,
    to_argv,
)

__all__ = [
    "AMP_DTYPES",
    "BACKBONE_NORMS",
    "BY_FLAG",
    "CHECK_MODES",
    "DEVICES",
    "ENGINES",
    "EXIF_ORIENTATIONS",
    "FIELDS",
    "GALLERY_MAX",
    "INT64_MAX",
    "MODEL_NAMES",
    "PREDICT_BY_FLAG",
    "PREDICT_FIELDS",
    "PREDICT_TRAIN_FLAGS",
    "PROFILE_BY_FLAG",
    "PROFILE_FIELDS",
    "PROFILE_TRAIN_FLAGS",
    "Bounds",
    "DataConfig",
    "FieldSpec",
    "ModelConfig",
    "OptimConfig",
    "PeersConfig",
    "PipelineConfig",
    "PredictConfig",
    "ProfileConfig",
    "TrainConfig",
    "apply_overrides",
    "build_config",
    "build_predict_config",
    "build_profile_config",
    "config_to_dict",
    "demo_flags",
    "field_specs",
    "fp16_on_cpu_problem",
    "load_yaml_config",
    "option",
    "saved_model_flags",
    "small_cpu_run",
    "to_argv",
]
