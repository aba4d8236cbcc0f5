"""Plain-data builders shared by the unit tests."""

from __future__ import annotations

from bot.core.domain import Family


def family(
    key: str, image: str = "img:1", path: str = "configs/x-master.yaml", **fields: object
) -> Family:
    values: dict[str, object] = {
        "id": f"{path}:{key}",
        "path": path,
        "key": key,
        "image": image,
        "runner": "b200",
        "clusters": ("b200-nb",),
        "model_prefix": "dsr1",
        "precision": "fp4",
        "framework": "sglang",
        "line_start": 1,
        "line_end": 5,
    }
    values.update(fields)
    return Family(**values)  # type: ignore[arg-type]
