"""Storefront actions on the template gallery (``marketplace/launch/gallery.py``), shown on the Templates page:
"Use" starts an order from an entry, "Copy to my templates" saves it as the organisation's own.

"Use" cannot know the offer yet: it remembers the entry in the session and opens the offers that have the GPU
memory it needs; the next order form (``marketplace/web/launch.py``) starts filled from it, once.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from marketplace.clients import client_address
from marketplace.launch.config import LaunchChoice, LaunchConfigInvalid, TemplateInvalid, launch_template_save
from marketplace.launch.gallery import GALLERY_PREFIX, GalleryEntry, gallery_get, gallery_launch, gallery_list
from marketplace.orders.selectors import BuyerPermission
from marketplace.web.orgs import buyer_access

SESSION_KEY = "gallery_start"


def _entry_or_404(slug: str) -> GalleryEntry:
    entry = gallery_get(slug)
    if entry is None:
        raise Http404("no such gallery template")
    return entry


def offers_query(entry: GalleryEntry) -> str:
    """The offer search that fits the entry: GPUs with at least the memory it needs."""
    return f"mem>={entry.min_gpu_memory_gb}"


@login_required
@require_POST
def gallery_use(request: HttpRequest, slug: str) -> HttpResponse:
    """Remember the entry for the next order form, and open the offers with the GPU memory it needs."""
    buyer_access(request, BuyerPermission.ORDER)
    entry = _entry_or_404(slug)
    request.session[SESSION_KEY] = entry.slug
    messages.info(
        request,
        f"Starting from {entry.name}: choose an offer with at least {entry.min_gpu_memory_gb} GB of GPU memory, "
        "and its order form is filled from the template.",
    )
    return redirect(f"{reverse('storefront:offers')}?{urlencode({'q': offers_query(entry)})}")


def gallery_start_take(request: HttpRequest) -> GalleryEntry | None:
    """The entry "Use" remembered, forgotten as it is taken: it fills one order form, not every later one."""
    slug = request.session.pop(SESSION_KEY, None)
    return gallery_get(slug) if isinstance(slug, str) else None


@login_required
@require_POST
def gallery_copy(request: HttpRequest, slug: str) -> HttpResponse:
    """Save the entry as one of the organisation's templates, under the name given, with the secret values
    typed on the card (a template without them would start a workload that refuses to run)."""
    membership = buyer_access(request, BuyerPermission.ORDER)
    entry = _entry_or_404(slug)
    name = request.POST.get("name", "").strip() or entry.name
    values: dict[str, Any] = {
        v.name: request.POST.get(f"value_{v.name}", "") for v in entry.variables if v.required and v.secret
    }
    try:
        launch = gallery_launch(entry, values)
        template = launch_template_save(
            organization=membership.organization,
            user=request.user,  # type: ignore[arg-type]
            name=name,
            description=entry.description[:255],
            choice=LaunchChoice(data=launch, caller_address=client_address(request) or None),
        )
    except LaunchConfigInvalid as exc:
        problems = "; ".join(f"{field.removeprefix('env.')}: {why}" for field, why in exc.fields.items())
        messages.error(request, f"Not copied: {problems}.")
        return redirect(reverse("storefront:templates") + f"#gallery-{entry.slug}")
    except TemplateInvalid as exc:
        messages.error(request, f"Not copied: {exc}.")
        return redirect(reverse("storefront:templates") + f"#gallery-{entry.slug}")
    messages.success(
        request,
        f"Copied {entry.name} as your template {template.name}: choose it under “Start from a launch template” "
        "when you order. Who may reach it defaults to your address now; change it on the order form.",
    )
    return redirect(reverse("storefront:templates") + f"#template-{template.public_id}")


def start_choices() -> list[tuple[str, str]]:
    """The gallery as the order form's "start from" choices: (value, label)."""
    return [(f"{GALLERY_PREFIX}{e.slug}", e.name) for e in gallery_list()]
