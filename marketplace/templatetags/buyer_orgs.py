"""``{% buyer_header as buyer %}``: the signed-in buyer's active organisation, the others they may switch to,
and what their role may do, for the page header and the buttons a role cannot use (marketplace/web/orgs.py)."""

from __future__ import annotations

from typing import Any

from django import template

from marketplace.web.orgs import HeaderAccess, header_access

register = template.Library()


@register.simple_tag(takes_context=True)
def buyer_header(context: dict[str, Any]) -> HeaderAccess | None:
    request = context.get("request")
    if request is None or not getattr(request, "user", None) or not request.user.is_authenticated:
        return None
    return header_access(request)
