"""GpuModel rows from the spec table (``providers/gpu_specs.py``, where the independent providers' checks read
it too): the migrations that seed the catalogue's models and the tests that need them call this."""

from __future__ import annotations

from typing import Any

from providers.gpu_specs import GPU_SPECS


def gpu_models_upsert(model: Any, *, keys: frozenset[str] | None = None) -> int:
    """Create or update every spec row (only those of ``keys``, when given) on ``model`` (the GpuModel class,
    or its migration-time version); safe to run again. Returns how many rows it wrote."""
    specs = [spec for spec in GPU_SPECS if keys is None or spec["key"] in keys]
    for spec in specs:
        model.objects.update_or_create(key=spec["key"], defaults={k: v for k, v in spec.items() if k != "key"})
    return len(specs)
