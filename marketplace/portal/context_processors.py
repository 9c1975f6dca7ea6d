"""What the site's navigation needs to know about the signed-in user, computed only if a page asks."""

from __future__ import annotations

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from marketplace.models import Membership


def organization_kinds(request: HttpRequest) -> dict[str, object]:
    """``org_kinds``: the kinds of organisation ("buyer", "provider") the user belongs to, one query, lazily."""

    def kinds() -> frozenset[str]:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return frozenset()
        return frozenset(Membership.objects.filter(user=user).values_list("organization__kind", flat=True))

    return {"org_kinds": SimpleLazyObject(kinds)}
