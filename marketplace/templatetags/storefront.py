from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.filter
def get_item(mapping: dict[Any, Any], key: Any) -> Any:
    """``mapping[key]`` in a template, None when absent."""
    return mapping.get(key) if mapping else None
