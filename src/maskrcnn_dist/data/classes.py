"""Which of a dataset's categories the model learns, judged over all its splits at once.

Annotation tools write categories no object can have: Roboflow a category 0 named after the project,
the supercategory of the others; labelme's converter `_background_`. Trained as classes they add a
head that can never be positive. A category with no annotation in any split that is such a
placeholder (named as a background, the supercategory of another category, or id 0) is left out, with
one warning naming it; any other category without objects is kept, with a warning.

Crowd annotations (iscrowd 1) are not training targets (torchvision's reference), and CVAT writes its
brush masks that way: a class drawn only with the brush would never be learned. Each such class is
named with its count and the switch that trains crowd masks as instances (--crowd-as-instances).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

BACKGROUND_NAMES = frozenset({"_background_", "__background__", "background", "bg", "__ignore__", "_ignore_"})


@dataclass(frozen=True)
class ClassPlan:
    """The categories kept as classes, the placeholders left out (id -> why), the empty ones kept."""

    kept: tuple[int, ...]
    placeholders: dict[int, str]
    empty: tuple[int, ...]
    names: dict[int, str]
    instances: Counter
    crowd: Counter

    def crowd_only(self) -> list[int]:
        """Categories whose every annotation is a crowd region."""
        return [cid for cid in self.kept if self.crowd[cid] and not self.instances[cid]]

    def label(self, cid: int) -> str:
        return f"{self.names[cid]!r} (id {cid})"

    def lines(self, crowd_as_instances: bool) -> list[str]:
        """What check-data prints: each class with its counts, then the placeholders left out."""
        lines = [f"{len(self.kept)} classes:"]
        for cid in self.kept:
            crowd = f", {self.crowd[cid]} crowd" if self.crowd[cid] else ""
            trained = " (trained as instances)" if crowd and crowd_as_instances else ""
            lines.append(f"  {self.label(cid)}: {self.instances[cid]} instances{crowd}{trained}")
        lines += [f"  left out: {self.label(cid)}, {why}" for cid, why in self.placeholders.items()]
        return lines


def placeholder_reason(cid: int, category: dict[str, Any], supercategories: set[str]) -> str | None:
    """Why a category without objects is an annotation tool's placeholder, or None when it is not one."""
    name = category["name"]
    if name.strip().lower() in BACKGROUND_NAMES:
        return "a background placeholder (labelme's converter writes _background_)"
    if name in supercategories:
        return "the supercategory of the others (Roboflow writes the project as category 0)"
    if cid == 0:
        return "category id 0, which COCO tools use for a placeholder"
    return None


def plan_classes(splits: Sequence[Any]) -> ClassPlan:
    """The class plan over the splits (dataset.Split), whose categories must be the same."""
    categories: dict[int, dict[str, Any]] = dict(splits[0].categories)
    instances: Counter = Counter()
    crowd: Counter = Counter()
    for split in splits:
        instances.update(split.instance_counts)
        crowd.update(split.crowd_counts)
    supercategories = {
        str(c["supercategory"]) for cid, c in categories.items() if c.get("supercategory") not in (None, c["name"])
    }
    placeholders: dict[int, str] = {}
    for cid, category in sorted(categories.items()):
        if instances[cid] or crowd[cid]:
            continue
        if reason := placeholder_reason(cid, category, supercategories):
            placeholders[cid] = reason
    kept = tuple(cid for cid in sorted(categories) if cid not in placeholders)
    if not kept:  # a file with no objects at all (evaluated only): nothing to judge, keep them all
        kept, placeholders = tuple(sorted(categories)), {}
    empty = tuple(cid for cid in kept if not instances[cid] and not crowd[cid])
    names = {cid: str(c["name"]) for cid, c in categories.items()}
    return ClassPlan(kept, placeholders, empty, names, instances, crowd)


def judge_classes(splits: Sequence[Any], crowd_as_instances: bool) -> ClassPlan:
    """Plan the classes over the splits (each split takes plan.kept) and warn once about each
    placeholder left out, each category without objects and each crowd-only category."""
    plan = plan_classes(splits)
    where = splits[0].annotation_file
    for cid, why in plan.placeholders.items():
        log.warning(
            "%s: category %s has no annotation and is %s: left out of the model's classes",
            where,
            plan.label(cid),
            why,
        )
    if plan.empty:
        log.warning(
            "%s: categories with no annotation in any split, kept as classes that can never be learned: %s",
            where,
            ", ".join(map(plan.label, plan.empty)),
        )
    if not crowd_as_instances:
        for cid in plan.crowd_only():
            log.warning(
                "%s: every annotation of category %s is a crowd region (iscrowd 1, %d of them; CVAT writes "
                "brush masks so): crowd regions are not trained; --crowd-as-instances trains them as instances",
                where,
                plan.label(cid),
                plan.crowd[cid],
            )
    return plan
