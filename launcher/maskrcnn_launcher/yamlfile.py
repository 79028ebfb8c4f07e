"""Reading a YAML file a user wrote (a topology, a trainer `--config`): one loader for both.

PyYAML keeps the last of two equal keys in a mapping silently, so `lr: 0.1` followed later by
`lr: 0.2`, or a topology's `replicas` given twice, would run with a value the user may not have
meant. The API server refuses such an object too; here it is a clear error naming the key and line.
"""

from __future__ import annotations

from typing import Any

import yaml


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: SafeLoader's own error names it below
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"found the key {key!r} twice", key_node.start_mark
                )
        return super().construct_mapping(node, deep)


def load_yaml(text: str) -> Any:
    """One YAML document, every mapping's keys unique (yaml.YAMLError otherwise)."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)


def load_yaml_all(text: str) -> list[Any]:
    """Every non-empty document of a YAML stream, every mapping's keys unique."""
    return [doc for doc in yaml.load_all(text, Loader=UniqueKeyLoader) if doc]  # noqa: S506
