"""Sellers and their connections to clouds."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal

from django.db import models

from providers.community.pricing import MAX_IDLE_AFTER_HOURS, PriceFallRule
from providers.registry import ADAPTERS
from providers.secrets import decrypt_secret, encrypt_secret
from providers.types import Credentials


class ProviderKind(models.TextChoices):
    AWS = "aws", "Amazon Web Services"
    AZURE = "azure", "Microsoft Azure"
    GCP = "gcp", "Google Cloud"
    ALIBABA = "alibaba", "Alibaba Cloud"
    TENCENT = "tencent", "Tencent Cloud"
    COMMUNITY = "community", "Independent provider"
    KUBERNETES = "kubernetes", "Kubernetes cluster"


class Provider(models.Model):
    """A seller on the marketplace: a cloud reseller or an independent owner of machines."""

    name = models.CharField(max_length=120, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class SyncStatus(models.TextChoices):
    NEVER = "never", "never synced"
    OK = "ok", "ok"
    FAILED = "failed", "failed"


class ProviderAccount(models.Model):
    """One provider's account on one cloud. Credentials are encrypted at rest and never rendered."""

    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="accounts")
    kind = models.CharField(max_length=16, choices=ProviderKind.choices)
    name = models.CharField(max_length=120)
    credentials_encrypted = models.TextField(blank=True, default="")
    endpoint_url = models.URLField(blank=True, default="", help_text="override for sovereign or local endpoints")
    regions = models.JSONField(default=list)
    options = models.JSONField(default=dict, blank=True)
    enabled = models.BooleanField(default=True)
    sync_status = models.CharField(max_length=16, choices=SyncStatus.choices, default=SyncStatus.NEVER)
    sync_error = models.TextField(blank=True, default="")
    last_synced_at = models.DateTimeField(null=True, blank=True)
    # The offer sync's fan-out (marketplace/catalog/fanout.py): when a sync was last handed to the queue, and
    # when the last one ended, so only so many are queued at once and none is queued twice.
    sync_claimed_at = models.DateTimeField(null=True, blank=True)
    sync_done_at = models.DateTimeField(null=True, blank=True)
    # Something it sells changed (a machine verified): its next claim comes first and does not wait for the
    # account to be due, and a sync already running when it changed is followed by another.
    sync_wanted_at = models.DateTimeField(null=True, blank=True)
    # The availability an independent host's or a cluster's seller commits to in percent (issue 38); NULL: the
    # market's floor. Clouds state their own published figure instead (marketplace/sla/published.py).
    sla_commitment_pct = models.DecimalField(max_digits=6, decimal_places=3, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["provider", "name"], name="provider_account_unique_name")]

    def __str__(self) -> str:
        return f"{self.provider.name}/{self.name} ({self.kind})"

    @property
    def is_supported(self) -> bool:
        return self.kind in ADAPTERS

    def set_credentials(self, values: dict[str, str]) -> None:
        self.credentials_encrypted = encrypt_secret(values)

    def credentials(self) -> Credentials:
        values = decrypt_secret(self.credentials_encrypted)
        if self.kind == ProviderKind.COMMUNITY:
            # An independent fleet authenticates per machine: its adapter gets the machines it may sell.
            values = {**values, "machines": json.dumps(self.community_machines())}
        return Credentials(kind=self.kind, values=values, endpoint_url=self.endpoint_url or None)

    def community_machines(self) -> list[dict[str, object]]:
        """The machines of a community account whose agents have registered, as its adapter reads them (``url``
        empty for an outbound-only agent, reached through its command queue). Only
        the verified, online ones are ``for_sale``; the others are still reached to describe and stop the
        instances of orders placed while they were on sale (a machine that moved to a new URL, say)."""
        # An outbound-only agent registers without a URL: registered is what counts, not reachable.
        rows = self.machines.filter(models.Q(registered_at__isnull=False) | ~models.Q(agent_url="")).order_by("name")
        return [
            {
                "name": m.name,
                "url": m.agent_url,
                "key_id": m.key_id,
                "secret": m.secret(),
                "region": m.region,
                "country": m.country,
                "gpu_model": m.gpu_model,
                "gpu_count": m.gpu_count,
                "gpu_memory_gb": m.gpu_memory_gb,
                "vcpus": m.vcpus,
                "memory_gib": m.memory_gib,
                "price_per_gpu_hour": str(m.price_per_gpu_hour),
                "min_bid_per_gpu_hour": None if m.min_bid_per_gpu_hour is None else str(m.min_bid_per_gpu_hour),
                "min_gpus_per_lease": m.min_gpus_per_lease,
                "mig_profiles": m.mig_profiles,
                "availability": m.availability,
                "for_sale": m.state == MachineState.VERIFIED and m.online,
            }
            for m in rows
        ]


class ClusterNode(models.Model):
    """One node of a Kubernetes seller's cluster as the last offer sync saw it: the capacity pool the broker
    places orders in, as an independent machine is one.

    ``units`` maps each extended resource the node sells (``nvidia.com/gpu``, ``nvidia.com/mig-1g.10gb``,
    ``nvidia.com/gpu.shared``) to the units the broker may place there: allocatable minus what the pods it did
    not place request. The broker's own pods are counted by its holds (``marketplace.NodeHold``), taken and
    released under this row's lock, so concurrent orders never place more than the node has free. A node no
    longer on sale (cordoned, NotReady, gone) keeps its row with no units, so the holds on it stay valid."""

    account = models.ForeignKey(ProviderAccount, on_delete=models.PROTECT, related_name="cluster_nodes")
    name = models.CharField(max_length=253)  # a node's name is a DNS subdomain
    units = models.JSONField(default=dict, blank=True)
    synced_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["account", "name"], name="cluster_node_unique_name")]

    def __str__(self) -> str:
        return f"{self.name} {self.units}"


class MachineState(models.TextChoices):
    PENDING = "pending", "pending verification"
    VERIFIED = "verified", "verified"
    SUSPENDED = "suspended", "suspended"


class Machine(models.Model):
    """An independent provider's machine, listed for sale and reached through its host agent.

    Belongs to the provider's ``community`` account. Sold only while verified by staff, online (heartbeats
    within ``BROKER_AGENT_SILENCE_S``) and inside an availability window. ``secret_encrypted`` is the
    agent's HMAC secret (providers/community/protocol.py), shown once when listed.
    """

    account = models.ForeignKey(ProviderAccount, on_delete=models.PROTECT, related_name="machines")
    name = models.SlugField(max_length=60)
    key_id = models.CharField(max_length=40, unique=True)
    secret_encrypted = models.TextField()
    agent_url = models.URLField(blank=True, default="")
    gpu_model = models.CharField(max_length=32)
    gpu_count = models.PositiveSmallIntegerField()
    gpu_memory_gb = models.PositiveIntegerField()
    vcpus = models.PositiveIntegerField()
    memory_gib = models.PositiveIntegerField()
    disk_gb = models.PositiveIntegerField()
    network_gbps = models.DecimalField(max_digits=8, decimal_places=2)
    country = models.CharField(max_length=2)
    region = models.CharField(max_length=64)
    price_per_gpu_hour = models.DecimalField(max_digits=10, decimal_places=4)
    min_bid_per_gpu_hour = models.DecimalField(max_digits=10, decimal_places=4, null=True, blank=True)
    # The fewest GPUs one lease takes: ``gpu_count`` sells the machine whole, fewer makes it divisible.
    min_gpus_per_lease = models.PositiveSmallIntegerField()
    mig_profiles = models.JSONField(default=list, blank=True)  # e.g. ["1g.10gb"]; providers/community/mig.py
    # The price falls the seller accepts (providers/community/pricing.py); the defaults fall nothing. Set only
    # through ``machine_price_fall_set``, which checks them as ``PriceFallRule`` does.
    # Defaults in the database too, so rows written by older code (a data migration's model) fall nothing.
    fragment_discount_pct = models.DecimalField(
        max_digits=5, decimal_places=2, default=Decimal(0), db_default=Decimal(0)
    )
    idle_after_hours = models.PositiveIntegerField(default=0, db_default=0)
    idle_step_pct = models.DecimalField(max_digits=5, decimal_places=2, default=Decimal(0), db_default=Decimal(0))
    floor_pct = models.DecimalField(max_digits=5, decimal_places=2, default=Decimal(100), db_default=Decimal(100))
    # [{"weekdays": [0..6], "start": "HH:MM", "end": "HH:MM"}] in UTC; empty: always available.
    availability = models.JSONField(default=list, blank=True)
    state = models.CharField(max_length=16, choices=MachineState.choices, default=MachineState.PENDING)
    online = models.BooleanField(default=False)
    registered_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    hardware = models.JSONField(default=dict, blank=True)
    self_test = models.JSONField(default=dict, blank=True)
    self_test_ok = models.BooleanField(null=True)
    # The heartbeat rate limit's window, kept on the row so it holds across web processes.
    beat_window_start = models.DateTimeField(null=True, blank=True)
    beat_window_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["account", "name"], name="machine_unique_name"),
            models.CheckConstraint(condition=models.Q(gpu_count__gte=1), name="machine_gpu_count_positive"),
            models.CheckConstraint(condition=models.Q(price_per_gpu_hour__gt=0), name="machine_price_positive"),
            models.CheckConstraint(
                condition=models.Q(min_gpus_per_lease__gte=1, min_gpus_per_lease__lte=models.F("gpu_count")),
                name="machine_min_gpus_per_lease_within_count",
            ),
            models.CheckConstraint(
                condition=models.Q(
                    fragment_discount_pct__gte=0,
                    fragment_discount_pct__lte=100,
                    idle_step_pct__gte=0,
                    idle_step_pct__lte=100,
                    floor_pct__gte=0,
                    floor_pct__lte=100,
                    idle_after_hours__lte=MAX_IDLE_AFTER_HOURS,
                ),
                name="machine_price_fall_in_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.gpu_count}x {self.gpu_model})"

    @property
    def divisible(self) -> bool:
        return self.min_gpus_per_lease < self.gpu_count

    @property
    def price_fall(self) -> PriceFallRule:
        """The seller's price falls for this machine, as the pure rule reads them."""
        return PriceFallRule(
            fragment_discount_pct=self.fragment_discount_pct,
            idle_after_hours=self.idle_after_hours,
            idle_step_pct=self.idle_step_pct,
            floor_pct=self.floor_pct,
        )

    def secret(self) -> str:
        return decrypt_secret(self.secret_encrypted)["secret"]

    def set_secret(self, secret: str) -> None:
        self.secret_encrypted = encrypt_secret({"secret": secret})


class MachineHeartbeat(models.Model):
    """One heartbeat's telemetry: the utilization chart and uptime are computed from these.

    ``unverified_reason`` is empty for telemetry a GPU can physically show; else it says what no GPU of the
    listed model could report (``providers.community.plausibility``). Such a heartbeat still proves the
    agent is alive, but its figures are shown as "unverified: <reason>", never as fact."""

    machine = models.ForeignKey(Machine, on_delete=models.CASCADE, related_name="heartbeats", db_index=False)
    at = models.DateTimeField()
    utilization_pct = models.DecimalField(max_digits=5, decimal_places=1)
    temperature_c = models.DecimalField(max_digits=5, decimal_places=1)
    power_w = models.DecimalField(max_digits=9, decimal_places=1)
    gpus = models.JSONField(default=list)
    instances = models.PositiveIntegerField(default=0)
    unverified_reason = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["machine", "at"], name="heartbeat_machine_time")]

    def __str__(self) -> str:
        return f"{self.machine_id} at {self.at}"


class AgentNonce(models.Model):
    """Nonces seen from agents within the signature window: a second request with one is a replay."""

    key_id = models.CharField(max_length=40)
    nonce = models.CharField(max_length=128)
    seen_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["key_id", "nonce"], name="agent_nonce_unique")]
        indexes = [models.Index(fields=["seen_at"], name="agent_nonce_seen")]

    def __str__(self) -> str:
        return f"{self.key_id} {self.nonce}"


class AgentCommandKind(models.TextChoices):
    STATUS = "status", "status"
    LAUNCH = "launch", "launch"
    DESCRIBE = "describe", "describe"
    TERMINATE = "terminate", "terminate"
    FIND = "find", "find by order"


class AgentCommandState(models.TextChoices):
    PENDING = "pending", "waiting for the agent's poll"
    DELIVERED = "delivered", "handed to the agent"
    ANSWERED = "answered", "answered"
    EXPIRED = "expired", "the broker stopped waiting"


class AgentCommand(models.Model):
    """One broker -> agent request for a machine whose agent is outbound-only (no public URL): queued here,
    handed out once on the agent's poll, answered by it (providers/community/protocol.py, ``commands.py``).

    ``headers`` are the broker's signature over the request, its id and ``expires_at``: the agent runs it only
    before then. A command the broker gave up on is ``expired`` by a conditional update, after which an
    answer is refused; whichever of the two lands first wins."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    machine = models.ForeignKey(Machine, on_delete=models.CASCADE, related_name="commands", db_index=False)
    kind = models.CharField(max_length=16, choices=AgentCommandKind.choices)
    method = models.CharField(max_length=8)
    target = models.CharField(max_length=512)
    body = models.TextField(blank=True, default="")
    headers = models.JSONField(default=dict)
    state = models.CharField(max_length=16, choices=AgentCommandState.choices, default=AgentCommandState.PENDING)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    answered_at = models.DateTimeField(null=True, blank=True)
    answer_status = models.PositiveSmallIntegerField(null=True, blank=True)
    answer = models.JSONField(null=True, blank=True)

    class Meta:
        # The poll reads a machine's pending commands oldest first.
        indexes = [models.Index(fields=["machine", "state", "created_at"], name="agent_command_queue")]

    def __str__(self) -> str:
        return f"{self.kind} {self.method} {self.target} ({self.state})"


class AgentPollWindow(models.Model):
    """The poll rate limit's window for one machine's outbound agent, counted with conditional updates as
    the heartbeat limit is (so it holds across web processes)."""

    machine = models.OneToOneField(Machine, on_delete=models.CASCADE, primary_key=True, related_name="poll_window")
    window_start = models.DateTimeField(null=True, blank=True)
    window_count = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.machine_id}: {self.window_count} since {self.window_start}"
