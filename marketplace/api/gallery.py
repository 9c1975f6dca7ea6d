"""The template gallery over the API, read-only: the ready launch configurations the broker maintains
(``marketplace/launch/gallery.py``), the same for every organisation. Ordering from one is an order or quote
with its ``launch`` (filled with the buyer's values), or a copy saved with ``POST /launch-templates``."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.api.launch import ERROR
from marketplace.launch.gallery import GalleryEntry, gallery_get, gallery_list

# Nothing in the gallery is private: any token that can look at offers or order may read it.
READ_SCOPES = ("offers:read", "orders:place", "keys:manage")


class GalleryVariableOutput(serializers.Serializer):
    name = serializers.CharField()
    purpose = serializers.CharField()
    required = serializers.BooleanField(help_text="it must have a value when ordering")
    secret = serializers.BooleanField(help_text="kept encrypted, never shown again once given")
    default = serializers.CharField(help_text='the value it starts with ("" for none)')


class GalleryEntryOutput(serializers.Serializer):
    slug = serializers.CharField(help_text="name it as gallery:SLUG, e.g. broker launch --template gallery:vllm")
    name = serializers.CharField()
    description = serializers.CharField()
    kind = serializers.ChoiceField(choices=["container", "script"])
    image = serializers.CharField(help_text='the container image ("" for a script)')
    min_gpu_memory_gb = serializers.IntegerField(help_text="GPU memory per GPU it needs, GB")
    memory_note = serializers.CharField(help_text="what that figure assumes")
    variables = GalleryVariableOutput(many=True)
    usage = serializers.CharField(help_text="what to do once the machine is ready")
    launch = serializers.JSONField(help_text="the launch configuration, variables at their defaults")

    def to_representation(self, instance: GalleryEntry) -> dict[str, Any]:
        return {
            "slug": instance.slug,
            "name": instance.name,
            "description": instance.description,
            "kind": instance.kind,
            "image": instance.image,
            "min_gpu_memory_gb": instance.min_gpu_memory_gb,
            "memory_note": instance.memory_note,
            "variables": GalleryVariableOutput(instance.variables, many=True).data,
            "usage": instance.usage,
            "launch": instance.launch,
        }


class GalleryListOutput(serializers.Serializer):
    results = GalleryEntryOutput(many=True)


class GalleryListApi(APIView):
    """GET /api/v1/templates/gallery: every gallery entry (a short list, not paginated)."""

    required_scopes = {"GET": READ_SCOPES}

    @extend_schema(operation_id="template_gallery_list", responses={200: GalleryListOutput})
    def get(self, request: Request) -> Response:
        return Response({"results": GalleryEntryOutput(gallery_list(), many=True).data})


class GalleryDetailApi(APIView):
    """GET /api/v1/templates/gallery/{slug}: one entry."""

    required_scopes = {"GET": READ_SCOPES}

    @extend_schema(
        operation_id="template_gallery_retrieve",
        responses={200: GalleryEntryOutput, 404: ERROR},
    )
    def get(self, request: Request, slug: str) -> Response:
        entry = gallery_get(slug)
        if entry is None:
            raise NotFound("no such gallery template (GET /api/v1/templates/gallery lists them)")
        return Response(GalleryEntryOutput(entry).data)
