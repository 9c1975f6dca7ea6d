"""SSH key and launch template API views (scope ``keys:manage``): parse, check ownership, call one service,
render. A key's text is never echoed back in an error: a private key pasted by mistake must not travel again."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.api import idempotency, pagination
from marketplace.api.errors import error_response
from marketplace.api.launch_schema import LAUNCH_VIEW, LaunchConfigurationField
from marketplace.api.schema import ERROR
from marketplace.api.tokens import request_organization
from marketplace.clients import client_address as request_address
from marketplace.launch.config import (
    LaunchChoice,
    TemplateInvalid,
    launch_template_delete,
    launch_template_get,
    launch_template_save,
    launch_view,
)
from marketplace.launch.keys import SshKeyRefused, ssh_key_add, ssh_key_delete, ssh_key_get, ssh_key_list
from marketplace.models import LaunchTemplate, Organization, SshKey
from marketplace.orders.selectors import BuyerPermission
from providers.sshkeys import MAX_KEY_TEXT, MAX_NAME

SCOPES = ("keys:manage",)
READ_SCOPES = ("keys:manage", "orders:place")


def client_address(request: Request) -> str | None:
    """Where the request came from, behind the trusted proxies only (``broker.security.client_address``): the
    default for who may reach a machine the request launches."""
    return request_address(request) or None


# --------------------------------------------------------------------------------------------- SSH keys


class SshKeyInput(serializers.Serializer):
    public_key = serializers.CharField(
        max_length=MAX_KEY_TEXT, trim_whitespace=False, help_text="one key, e.g. the contents of ~/.ssh/id_ed25519.pub"
    )
    name = serializers.CharField(
        max_length=MAX_NAME, required=False, allow_blank=True, default="", help_text="default: the key's comment"
    )


class SshKeyOutput(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id")
    added_by = serializers.CharField(source="created_by.username")

    class Meta:
        model = SshKey
        fields = ["id", "name", "key_type", "bits", "fingerprint", "public_key", "added_by", "created_at"]


class SshKeyPageOutput(serializers.Serializer):
    results = SshKeyOutput(many=True)
    next_cursor = serializers.CharField(allow_null=True)
    next = serializers.CharField(allow_null=True)


def _organization(request: Request, permission: BuyerPermission = BuyerPermission.READ) -> Organization:
    return request_organization(request, permission)


def _key_or_404(request: Request, key_id: str, permission: BuyerPermission = BuyerPermission.READ) -> SshKey:
    key = ssh_key_get(organization=_organization(request, permission), public_id=key_id)
    if key is None:
        raise NotFound("no such SSH key")
    return key


class SshKeyListCreateApi(APIView):
    """GET lists the organisation's SSH keys; POST adds one (validated: ed25519, ECDSA or RSA of 3072+ bits)."""

    required_scopes = {"GET": READ_SCOPES, "POST": SCOPES}

    @extend_schema(operation_id="ssh_keys_list", parameters=pagination.PARAMETERS, responses={200: SshKeyPageOutput})
    def get(self, request: Request) -> Response:
        keys = ssh_key_list(organization=_organization(request))
        page = pagination.paginate(
            request, keys, keys=[pagination.Key("id", descending=True)], tag=pagination.listing_tag("ssh-keys")
        )
        return Response(page.body(request, SshKeyOutput(page.rows, many=True).data))

    @extend_schema(
        operation_id="ssh_keys_create",
        request=SshKeyInput,
        parameters=[idempotency.PARAMETER],
        responses={201: SshKeyOutput, 400: ERROR, 409: ERROR},
    )
    @idempotency.idempotent("ssh_keys.create")
    def post(self, request: Request) -> Response:
        organization = _organization(request, BuyerPermission.ORDER)
        body = SshKeyInput(data=request.data)
        if not body.is_valid():
            # DRF's messages never quote the value; keep only them.
            raise ValidationError({k: [str(m) for m in v] for k, v in body.errors.items()})
        try:
            key = ssh_key_add(
                organization=organization,
                user=request.user,
                public_key=body.validated_data["public_key"],
                name=body.validated_data["name"],
            )
        except SshKeyRefused as exc:
            if exc.code == "duplicate":
                return error_response("duplicate", str(exc), status.HTTP_409_CONFLICT, {exc.field: [str(exc)]})
            raise ValidationError({exc.field: [str(exc)]}) from None
        return Response(SshKeyOutput(key).data, status=status.HTTP_201_CREATED)


class SshKeyDetailApi(APIView):
    required_scopes = {"GET": READ_SCOPES, "DELETE": SCOPES}

    @extend_schema(operation_id="ssh_keys_retrieve", responses={200: SshKeyOutput, 404: ERROR})
    def get(self, request: Request, key_id: str) -> Response:
        return Response(SshKeyOutput(_key_or_404(request, key_id)).data)

    @extend_schema(operation_id="ssh_keys_destroy", responses={204: None, 404: ERROR})
    def delete(self, request: Request, key_id: str) -> Response:
        ssh_key_delete(key=_key_or_404(request, key_id, BuyerPermission.ORDER))
        return Response(status=status.HTTP_204_NO_CONTENT)


# ------------------------------------------------------------------------------------------ templates

LAUNCH_HELP = (
    "a launch configuration: image, workload (none | container | script), disk_gb, ports, allowed_cidrs, "
    "ssh_keys, spend_cap_usd, on_silence (keep | replace); see docs/BUYERS.md, Launch configuration"
)


class LaunchTemplateInput(serializers.Serializer):
    name = serializers.CharField(max_length=80)
    description = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")
    launch = LaunchConfigurationField(help_text=LAUNCH_HELP)


class LaunchTemplateOutput(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id")
    launch = serializers.SerializerMethodField()

    class Meta:
        model = LaunchTemplate
        fields = ["id", "name", "description", "launch", "created_at", "updated_at"]

    @extend_schema_field(LAUNCH_VIEW)
    def get_launch(self, template: LaunchTemplate) -> dict[str, Any] | None:
        return launch_view(template.configuration)


class LaunchTemplatePageOutput(serializers.Serializer):
    results = LaunchTemplateOutput(many=True)
    next_cursor = serializers.CharField(allow_null=True)
    next = serializers.CharField(allow_null=True)


def _template_or_404(
    request: Request, template_id: str, permission: BuyerPermission = BuyerPermission.READ
) -> LaunchTemplate:
    template = launch_template_get(organization=_organization(request, permission), ref=template_id)
    if template is None:
        raise NotFound("no such launch template")
    return template


def _save(request: Request, template: LaunchTemplate | None) -> Response:
    organization = _organization(request, BuyerPermission.ORDER)
    body = LaunchTemplateInput(data=request.data)
    body.is_valid(raise_exception=True)
    data = body.validated_data
    try:
        saved = launch_template_save(
            organization=organization,
            user=request.user,
            name=data["name"],
            description=data["description"],
            choice=LaunchChoice(data=data["launch"], caller_address=client_address(request)),
            template=template,
        )
    except TemplateInvalid as exc:
        field, _, message = str(exc).partition(": ")
        raise ValidationError({field: [message]}) from None
    code = status.HTTP_200_OK if template else status.HTTP_201_CREATED
    return Response(LaunchTemplateOutput(saved).data, status=code)


class LaunchTemplateListCreateApi(APIView):
    """GET lists the organisation's launch templates; POST saves one under a name."""

    required_scopes = {"GET": READ_SCOPES, "POST": READ_SCOPES}

    @extend_schema(
        operation_id="launch_templates_list",
        parameters=pagination.PARAMETERS,
        responses={200: LaunchTemplatePageOutput},
    )
    def get(self, request: Request) -> Response:
        templates = LaunchTemplate.objects.filter(organization=_organization(request)).select_related("configuration")
        page = pagination.paginate(
            request, templates, keys=[pagination.Key("id", descending=True)], tag=pagination.listing_tag("templates")
        )
        return Response(page.body(request, LaunchTemplateOutput(page.rows, many=True).data))

    @extend_schema(
        operation_id="launch_templates_create",
        request=LaunchTemplateInput,
        parameters=[idempotency.PARAMETER],
        responses={201: LaunchTemplateOutput, 400: ERROR, 409: ERROR},
    )
    @idempotency.idempotent("launch_templates.create")
    def post(self, request: Request) -> Response:
        return _save(request, None)


class LaunchTemplateDetailApi(APIView):
    required_scopes = {"GET": READ_SCOPES, "PUT": READ_SCOPES, "DELETE": READ_SCOPES}

    @extend_schema(operation_id="launch_templates_retrieve", responses={200: LaunchTemplateOutput, 404: ERROR})
    def get(self, request: Request, template_id: str) -> Response:
        return Response(LaunchTemplateOutput(_template_or_404(request, template_id)).data)

    @extend_schema(
        operation_id="launch_templates_update",
        request=LaunchTemplateInput,
        responses={200: LaunchTemplateOutput, 400: ERROR, 404: ERROR},
    )
    def put(self, request: Request, template_id: str) -> Response:
        return _save(request, _template_or_404(request, template_id, BuyerPermission.ORDER))

    @extend_schema(operation_id="launch_templates_destroy", responses={204: None, 404: ERROR})
    def delete(self, request: Request, template_id: str) -> Response:
        launch_template_delete(template=_template_or_404(request, template_id, BuyerPermission.ORDER))
        return Response(status=status.HTTP_204_NO_CONTENT)
