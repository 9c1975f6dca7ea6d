from marketplace.models.catalog import FxRate, GpuModel, Offer, OfferStatus, PricePoint, QuarantinedOffer
from marketplace.models.idempotency import IdempotentResponse
from marketplace.models.launch import (
    LaunchConfiguration,
    LaunchTemplate,
    Lease,
    LeaseHeartbeat,
    LeaseState,
    SshKey,
)
from marketplace.models.orders import (
    Attempt,
    AttemptOutcome,
    GpuHold,
    GpuSlot,
    Instance,
    InvoiceLine,
    Order,
    OrderState,
    Quote,
)
from marketplace.models.organizations import PROVIDER_ROLES, Membership, Organization, OrganizationKind, Role
from marketplace.models.providers_portal import Invitation, InvitationStatus, ProviderProfile, ProviderState
from marketplace.models.tokens import ApiToken, TokenScope
from marketplace.models.webhooks import (
    DeliveryState,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEventType,
)

__all__ = [
    "PROVIDER_ROLES",
    "ApiToken",
    "Attempt",
    "AttemptOutcome",
    "DeliveryState",
    "FxRate",
    "GpuHold",
    "GpuModel",
    "GpuSlot",
    "IdempotentResponse",
    "Instance",
    "Invitation",
    "InvitationStatus",
    "InvoiceLine",
    "LaunchConfiguration",
    "LaunchTemplate",
    "Lease",
    "LeaseHeartbeat",
    "LeaseState",
    "Membership",
    "Offer",
    "OfferStatus",
    "Order",
    "OrderState",
    "Organization",
    "OrganizationKind",
    "PricePoint",
    "ProviderProfile",
    "ProviderState",
    "QuarantinedOffer",
    "Quote",
    "Role",
    "SshKey",
    "TokenScope",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEndpoint",
    "WebhookEventType",
]
