from marketplace.models.catalog import FxRate, GpuModel, Offer, OfferStatus, PricePoint, QuarantinedOffer
from marketplace.models.orders import Attempt, AttemptOutcome, Instance, InvoiceLine, Order, OrderState, Quote
from marketplace.models.organizations import Membership, Organization, OrganizationKind, Role

__all__ = [
    "Attempt",
    "AttemptOutcome",
    "FxRate",
    "GpuModel",
    "Instance",
    "InvoiceLine",
    "Membership",
    "Offer",
    "OfferStatus",
    "Order",
    "OrderState",
    "Organization",
    "OrganizationKind",
    "PricePoint",
    "QuarantinedOffer",
    "Quote",
    "Role",
]
