"""Orders, each provisioning attempt, and the instance an order runs on."""

from __future__ import annotations

import datetime as dt
import uuid

from django.conf import settings
from django.db import models

from marketplace.models.catalog import PRICING_CHOICES, GpuModel, Offer
from marketplace.models.organizations import Organization
from providers.models import ProviderAccount


class Quote(models.Model):
    """One ranked answer to a buyer's demand: an offer at a price locked until ``expires_at``.

    Quotes of one request share ``batch``. An order placed from a quote pays ``price_per_hour`` whatever the
    offer's price has done since; a quote places at most one order (``Order.quote`` is unique).
    """

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="quotes")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="quotes")
    batch = models.UUIDField(db_index=True)
    rank = models.PositiveSmallIntegerField()
    offer = models.ForeignKey(Offer, on_delete=models.PROTECT, related_name="quotes")
    demand = models.JSONField(help_text="the demand as the engine read it, defaults resolved")
    units = models.DecimalField(max_digits=10, decimal_places=4, help_text="instances, or GPUs of a divisible listing")
    price_per_hour = models.DecimalField(max_digits=14, decimal_places=6, help_text="USD, locked")
    duration_hours = models.DecimalField(max_digits=10, decimal_places=2)
    total_price = models.DecimalField(max_digits=16, decimal_places=6, help_text="USD for the duration")
    # What an order from this quote launches, unless the order names its own.
    launch_config = models.ForeignKey(
        "marketplace.LaunchConfiguration", null=True, blank=True, on_delete=models.PROTECT, related_name="quotes"
    )
    score = models.FloatField(help_text="USD per unit of useful work; lower is better")
    breakdown = models.JSONField()
    reason = models.CharField(max_length=255)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["batch", "rank"]
        constraints = [models.UniqueConstraint(fields=["batch", "rank"], name="quote_batch_rank_unique")]

    def __str__(self) -> str:
        return f"quote {self.public_id} #{self.rank}"


class OrderState(models.TextChoices):
    PLACED = "placed", "placed"
    PROVISIONING = "provisioning", "provisioning"
    RUNNING = "running", "running"
    # Stopped by its buyer with its disk kept (issue 36): stopping while the provider halts the machine,
    # stopped once it has, starting from the buyer's resume until the lease agent reports again.
    STOPPING = "stopping", "stopping"
    STOPPED = "stopped", "stopped"
    STARTING = "starting", "starting"
    TERMINATING = "terminating", "terminating"
    TERMINATED = "terminated", "terminated"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


class OrderHealth(models.TextChoices):
    """How a running order's machine is doing, apart from its life cycle (``Order.health``)."""

    HEALTHY = "healthy", "healthy"
    DEGRADED = "degraded", "degraded: its agent stopped reporting"


class ClusterState(models.TextChoices):
    PROVISIONING = "provisioning", "provisioning"
    RUNNING = "running", "running"
    TERMINATING = "terminating", "terminating"
    TERMINATED = "terminated", "terminated"
    FAILED = "failed", "failed"


class Cluster(models.Model):
    """A job that spans machines: ``nodes`` instances of one offer (one instance type in one zone), bought,
    launched and ended as one unit.

    Each node is an order of its own (``Order.cluster``), so launching, booting, metering and terminating a
    node is what it is for any order. A round is one try on one offer: ``nodes`` orders that may not fail
    over alone. The cluster runs when every order of its round runs; when one fails, the round's others are
    terminated and the whole group is tried again on the next offer (``marketplace/orders/clusters.py``).
    With ``placement_group`` each round's nodes launch into one cluster placement group of their own, deleted
    once the round is over (``placement_groups_released`` counts the rounds whose group is gone).
    """

    TRANSITIONS: dict[str, frozenset[str]] = {
        ClusterState.PROVISIONING: frozenset({ClusterState.RUNNING, ClusterState.FAILED, ClusterState.TERMINATING}),
        # A running group that loses a node is tried again whole (failover), or fails.
        ClusterState.RUNNING: frozenset({ClusterState.PROVISIONING, ClusterState.TERMINATING, ClusterState.FAILED}),
        ClusterState.TERMINATING: frozenset({ClusterState.TERMINATED}),
        ClusterState.TERMINATED: frozenset(),
        ClusterState.FAILED: frozenset(),
    }
    FINAL_STATES = frozenset({ClusterState.TERMINATED, ClusterState.FAILED})

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="clusters")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="clusters")
    offer = models.ForeignKey(Offer, on_delete=models.PROTECT, related_name="clusters", help_text="this round's")
    quote = models.OneToOneField(Quote, null=True, blank=True, on_delete=models.PROTECT, related_name="cluster")
    nodes = models.PositiveSmallIntegerField()
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT)
    gpu_count = models.PositiveSmallIntegerField(help_text="GPUs per node")
    pricing_model = models.CharField(max_length=16, choices=PRICING_CHOICES)
    regions = models.JSONField(default=list, blank=True, help_text="allowed regions; empty means any")
    needs_rdma = models.BooleanField(default=False, help_text="InfiniBand/EFA/RDMA between the nodes")
    placement_group = models.BooleanField(
        default=False, help_text="each round's nodes in one cluster placement group (packed close together)"
    )
    placement_groups_released = models.PositiveSmallIntegerField(
        default=0, help_text="rounds 1..this have had their placement group deleted"
    )
    max_price_per_node_hour = models.DecimalField(max_digits=14, decimal_places=6)
    allow_failover = models.BooleanField(default=True)
    duration_hours = models.DecimalField(max_digits=8, decimal_places=2, null=True, blank=True)
    launch_config = models.ForeignKey(
        "marketplace.LaunchConfiguration", on_delete=models.PROTECT, related_name="clusters"
    )
    round = models.PositiveSmallIntegerField(default=1)
    state = models.CharField(max_length=16, choices=ClusterState.choices, default=ClusterState.PROVISIONING)
    state_reason = models.TextField(blank=True, default="")
    state_changed_at = models.DateTimeField()
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    request_fingerprint = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="cluster_idempotency_key_unique",
            ),
            models.CheckConstraint(condition=models.Q(nodes__gte=2), name="cluster_at_least_two_nodes"),
        ]
        indexes = [models.Index(fields=["state"], name="cluster_state")]

    def __str__(self) -> str:
        return f"cluster {self.public_id} ({self.state})"


class Order(models.Model):
    """A buyer's purchase. The demand (GPU model, count, regions, pricing, cap) is kept so failover can
    choose another offer that satisfies it; ``offer`` is the one being tried or running.

    State changes go only through ``marketplace.orders.transitions.order_transition``; the allowed moves are
    the ``TRANSITIONS`` table below. The life cycle starts one step earlier, as a ``Quote`` (quoted: a
    price locked until it expires); ordering the quote creates the order, placed.
    """

    TRANSITIONS: dict[str, frozenset[str]] = {
        OrderState.PLACED: frozenset({OrderState.PROVISIONING, OrderState.CANCELLED, OrderState.FAILED}),
        OrderState.PROVISIONING: frozenset({OrderState.RUNNING, OrderState.FAILED, OrderState.TERMINATING}),
        # A running order whose machine the provider took away (spot preemption, host loss) is provisioned
        # again when the buyer allowed failover, and fails otherwise.
        OrderState.RUNNING: frozenset(
            {
                OrderState.TERMINATING,
                OrderState.PROVISIONING,
                OrderState.FAILED,
                OrderState.STOPPING,
                OrderState.STARTING,
            }
        ),
        # A stop the provider refused goes back to running with its reason; a start it refused for capacity
        # goes back to stopped, the disk kept. A restart is running -> starting -> running. Each may be
        # terminated at any point.
        OrderState.STOPPING: frozenset({OrderState.STOPPED, OrderState.RUNNING, OrderState.TERMINATING}),
        OrderState.STOPPED: frozenset({OrderState.STARTING, OrderState.TERMINATING}),
        OrderState.STARTING: frozenset({OrderState.RUNNING, OrderState.STOPPED, OrderState.TERMINATING}),
        OrderState.TERMINATING: frozenset({OrderState.TERMINATED}),
        OrderState.TERMINATED: frozenset(),
        OrderState.FAILED: frozenset(),
        OrderState.CANCELLED: frozenset(),
    }
    FINAL_STATES = frozenset({OrderState.TERMINATED, OrderState.FAILED, OrderState.CANCELLED})
    # A running order's health, a second small machine beside its state: a running order whose agent went
    # silent is degraded and recovers when it reports again, while it stays running (metered, ended on
    # schedule, terminable). Moves go only through ``marketplace.orders.silence.order_health_transition``;
    # leaving running makes it healthy again with the order's own transition.
    HEALTH_TRANSITIONS: dict[str, frozenset[str]] = {
        OrderHealth.HEALTHY: frozenset({OrderHealth.DEGRADED}),
        OrderHealth.DEGRADED: frozenset({OrderHealth.HEALTHY}),
    }

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="orders")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="orders")
    offer = models.ForeignKey(Offer, on_delete=models.PROTECT, related_name="orders")
    # A quote places one order at most; its locked price becomes the order's price.
    quote = models.OneToOneField(Quote, null=True, blank=True, on_delete=models.PROTECT, related_name="order")
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT)
    gpu_count = models.PositiveSmallIntegerField()
    pricing_model = models.CharField(max_length=16, choices=PRICING_CHOICES)
    regions = models.JSONField(default=list, blank=True, help_text="allowed regions; empty means any")
    max_price_per_hour = models.DecimalField(max_digits=14, decimal_places=6)
    allow_failover = models.BooleanField(default=True)
    price_per_hour = models.DecimalField(max_digits=14, decimal_places=6, help_text="USD, locked at placement")
    # How long the buyer wants it to run; once running, ``run_until`` is when the broker stops it, so nothing
    # runs forgotten. NULL: until the buyer terminates it.
    duration_hours = models.DecimalField(max_digits=8, decimal_places=2, null=True, blank=True)
    # At most this much (USD at the locked price), counted over every machine the order ran on; with a
    # duration, whichever comes first ends it. NULL: no cap.
    spend_cap_usd = models.DecimalField(max_digits=12, decimal_places=2, null=True, blank=True)
    run_until = models.DateTimeField(null=True, blank=True)
    # An interruptible order on an independent machine: what the buyer bids per GPU-hour (at least the
    # machine's minimum), the price it pays and its rank against other bids (on demand outranks every bid).
    bid_per_gpu_hour = models.DecimalField(max_digits=10, decimal_places=4, null=True, blank=True)
    # Outbid: when its machine is taken from it (the notice period's end), and the attempt that takes its GPUs.
    preempt_at = models.DateTimeField(null=True, blank=True)
    preempted_for = models.ForeignKey(
        "marketplace.Attempt", null=True, blank=True, on_delete=models.SET_NULL, related_name="preempted_orders"
    )
    # What the machine runs and who may reach it; NULL only for orders placed before configurations existed.
    launch_config = models.ForeignKey(
        "marketplace.LaunchConfiguration", null=True, blank=True, on_delete=models.PROTECT, related_name="orders"
    )
    state = models.CharField(max_length=16, choices=OrderState.choices, default=OrderState.PLACED)
    state_reason = models.TextField(blank=True, default="")
    state_changed_at = models.DateTimeField()
    health = models.CharField(max_length=16, choices=OrderHealth.choices, default=OrderHealth.HEALTHY)
    # Starting (a resume or a restart): when the provider accepted the start or reboot. The lease agent's first
    # report after it makes the order running again; NULL until the provider has answered.
    resumed_at = models.DateTimeField(null=True, blank=True)
    # NULL, not "", for "no key": the partial unique constraint must ignore orders placed without one.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    request_fingerprint = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    # A node of a multi-node job: its cluster, the round (one try on one offer) and its place in it.
    cluster = models.ForeignKey(Cluster, null=True, blank=True, on_delete=models.PROTECT, related_name="orders")
    cluster_round = models.PositiveSmallIntegerField(null=True, blank=True)
    cluster_node = models.PositiveSmallIntegerField(null=True, blank=True)
    # A replica of a fleet (marketplace/fleets/): otherwise a plain order in every respect.
    fleet = models.ForeignKey(
        "marketplace.Fleet", null=True, blank=True, on_delete=models.PROTECT, related_name="replicas"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="order_idempotency_key_unique",
            ),
            # One order per node of a round: two coordinators starting the same round cannot double a node.
            models.UniqueConstraint(
                fields=["cluster", "cluster_round", "cluster_node"],
                condition=models.Q(cluster__isnull=False),
                name="order_one_per_cluster_node",
            ),
            models.CheckConstraint(condition=models.Q(gpu_count__gte=1), name="order_gpu_count_positive"),
        ]
        indexes = [
            models.Index(fields=["state", "state_changed_at"], name="order_state_age"),
            models.Index(fields=["run_until"], name="order_scheduled_end", condition=models.Q(run_until__isnull=False)),
            models.Index(
                fields=["preempt_at"], name="order_preemption_due", condition=models.Q(preempt_at__isnull=False)
            ),
        ]

    def __str__(self) -> str:
        return f"order {self.public_id} ({self.state})"

    @property
    def instance(self) -> Instance | None:
        """The live instance, else the most recent one (one that failed before running, for the record)."""
        instances = sorted(self.instances.all(), key=lambda i: (i.active, i.pk), reverse=True)
        return instances[0] if instances else None

    @property
    def ref(self) -> str:
        """The reference the broker tags provider instances with."""
        return f"ord-{self.public_id.hex}"

    @staticmethod
    def public_id_of(ref: str) -> uuid.UUID | None:
        """The public id a ``ref`` names (as a provider's tag or label gives it back); None for anything else."""
        if not ref.startswith("ord-") or len(ref) != 36:
            return None
        try:
            return uuid.UUID(hex=ref[4:])
        except ValueError:
            return None


class AttemptOutcome(models.TextChoices):
    PENDING = "pending", "pending"
    LAUNCHED = "launched", "launched"
    FAILED = "failed", "failed"


class Attempt(models.Model):
    """One try at provisioning an order on one offer. Recorded before the provider is called, so a crashed
    or redelivered task resumes the same attempt with the same client token instead of launching twice."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveSmallIntegerField()
    offer = models.ForeignKey(Offer, on_delete=models.PROTECT, related_name="attempts")
    client_token = models.CharField(max_length=64, unique=True)
    outcome = models.CharField(max_length=16, choices=AttemptOutcome.choices, default=AttemptOutcome.PENDING)
    error_class = models.CharField(max_length=32, blank=True, default="")
    provider_code = models.CharField(max_length=128, blank=True, default="")
    provider_message = models.TextField(blank=True, default="")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    reserved = models.PositiveIntegerField(default=0)  # units held on a finite listing until released

    class Meta:
        ordering = ["order", "number"]
        constraints = [models.UniqueConstraint(fields=["order", "number"], name="attempt_order_number_unique")]
        # Recent failures block their scope for every order (marketplace/orders/blocks.py).
        indexes = [
            models.Index(fields=["finished_at"], name="attempt_recent_failure", condition=models.Q(outcome="failed"))
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.order_id}: {self.outcome}"


class NodeHold(models.Model):
    """Units of one extended resource on one Kubernetes node held for an attempt, from its reservation until
    the attempt's units are released, when the row is deleted (marketplace/orders/reservations.py takes them
    under the node's row lock). The device plugin, not the broker, picks which GPU the pod gets, so a hold
    counts units rather than naming GPUs."""

    node = models.ForeignKey("providers.ClusterNode", on_delete=models.PROTECT, related_name="holds")
    attempt = models.OneToOneField(Attempt, on_delete=models.CASCADE, related_name="node_hold")
    resource = models.CharField(max_length=120)
    units = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=models.Q(units__gte=1), name="node_hold_units_positive")]

    def __str__(self) -> str:
        return f"{self.units} {self.resource} on {self.node_id} for attempt {self.attempt_id}"


class GpuHold(models.Model):
    """One GPU of an independent provider's machine held for an attempt, or one MIG slice of it, from its
    reservation until the attempt's units are released, when the row is deleted.

    A whole GPU's hold has no ``mig_profile`` and covers the GPU's 8 memory slices (``slot`` 0, 8 of them, all
    7 compute slices); a slice's names its profile and records where it sits: ``slot`` its first memory slice
    (one of NVIDIA's placements for the profile), ``memory_slices`` and ``compute_slices`` its size. Several
    slices share one GPU index; a whole hold never does (unique per machine and index). The memory slices each
    hold covers are rows of ``GpuSlot``, unique per GPU, which is what makes two orders unable to get the same
    GPU or overlapping slices of it, whatever the code above does (marketplace/orders/reservations.py picks
    them under a lock on the machine)."""

    machine = models.ForeignKey("providers.Machine", on_delete=models.PROTECT, related_name="gpu_holds", db_index=False)
    gpu_index = models.PositiveSmallIntegerField()
    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="gpu_holds")
    mig_profile = models.CharField(max_length=16, blank=True, default="")  # providers/community/mig.py
    slot = models.PositiveSmallIntegerField(default=0)
    memory_slices = models.PositiveSmallIntegerField(default=8)
    compute_slices = models.PositiveSmallIntegerField(default=7)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["machine", "gpu_index"], condition=models.Q(mig_profile=""), name="gpu_hold_whole_unique_index"
            ),
            # A whole GPU is all of it. A slice lies inside the GPU's 8 memory slices with no more compute slices
            # than memory ones, and one with as many (1g with 1, 2g with 2, 4g with 4) never covers the 8th
            # memory slice, as none of NVIDIA's placements does: then slices that share no memory slice hold
            # at most the GPU's 7 compute slices between them.
            models.CheckConstraint(
                condition=models.Q(mig_profile="", slot=0, memory_slices=8, compute_slices=7)
                | (
                    ~models.Q(mig_profile="")
                    & models.Q(compute_slices__gte=1, compute_slices__lte=models.F("memory_slices"))
                    & models.Q(slot__lte=8 - models.F("memory_slices"))
                    & (
                        models.Q(compute_slices__lt=models.F("memory_slices"))
                        | models.Q(slot__lte=7 - models.F("memory_slices"))
                    )
                ),
                name="gpu_hold_shape",
            ),
        ]

    def __str__(self) -> str:
        what = f"{self.mig_profile} of GPU" if self.mig_profile else "GPU"
        return f"{what} {self.gpu_index} of machine {self.machine_id} for attempt {self.attempt_id}"


class GpuSlot(models.Model):
    """One of a GPU's 8 memory slices (MIG's unit of placement) taken by a hold: all eight for a whole GPU,
    the run a slice's placement covers for a slice. Unique per machine, GPU index and slot, so no two holds
    ever share any part of a GPU, and a whole-GPU lease can never be given a GPU that a slice uses."""

    hold = models.ForeignKey(GpuHold, on_delete=models.CASCADE, related_name="slots")
    machine = models.ForeignKey("providers.Machine", on_delete=models.PROTECT, related_name="+", db_index=False)
    gpu_index = models.PositiveSmallIntegerField()
    slot = models.PositiveSmallIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["machine", "gpu_index", "slot"], name="gpu_slot_unique"),
            models.CheckConstraint(condition=models.Q(slot__lte=7), name="gpu_slot_within_gpu"),
        ]

    def __str__(self) -> str:
        return f"memory slice {self.slot} of GPU {self.gpu_index} of machine {self.machine_id}"


class Instance(models.Model):
    """A provider machine launched for an order. At most one is ``active`` per order (a database constraint);
    one that failed before running (an asynchronous capacity failure) stays as history, inactive."""

    order = models.ForeignKey(Order, on_delete=models.PROTECT, related_name="instances")
    active = models.BooleanField(default=True)
    attempt = models.OneToOneField(Attempt, on_delete=models.PROTECT, related_name="instance")
    account = models.ForeignKey(ProviderAccount, on_delete=models.PROTECT, related_name="instances")
    provider_instance_id = models.CharField(max_length=128)
    region = models.CharField(max_length=64)
    zone = models.CharField(max_length=64)
    instance_type = models.CharField(max_length=64)
    state = models.CharField(max_length=16)
    public_ip = models.CharField(max_length=64, blank=True, default="")
    launched_at = models.DateTimeField()
    running_at = models.DateTimeField(null=True, blank=True, help_text="when the provider said running")
    # When the buyer could use it (the agent's ready report): metering starts here, not at the provider's
    # "running", which comes before the image has booted, the workload started and SSH answers.
    ready_at = models.DateTimeField(null=True, blank=True)
    terminated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["account", "region", "provider_instance_id"], name="instance_unique"),
            models.UniqueConstraint(
                fields=["order"], condition=models.Q(active=True), name="instance_one_active_per_order"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.provider_instance_id} ({self.state})"


class StoppedPeriod(models.Model):
    """A stretch in which the buyer had the order's machine stopped (issue 36): from the moment the provider
    accepted the stop to the lease agent's first report after the start (``ended_at``; open while stopped).

    Metering leaves these seconds out of the compute charge and charges ``usd_per_hour`` for them instead:
    what the provider bills for a stopped machine (``ProviderAdapter.stopped_billing`` says it in words), fixed
    when the stop was accepted. At most one period per order is open (a database constraint)."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="stopped_periods")
    instance = models.ForeignKey(Instance, on_delete=models.PROTECT, related_name="stopped_periods")
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    usd_per_hour = models.DecimalField(max_digits=14, decimal_places=6, help_text="USD charged while stopped")
    billing_rule = models.TextField(blank=True, default="", help_text="what the provider bills while stopped, why")

    class Meta:
        ordering = ["order", "started_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["order"], condition=models.Q(ended_at__isnull=True), name="stopped_period_one_open_per_order"
            ),
            models.CheckConstraint(
                condition=models.Q(ended_at__isnull=True) | models.Q(ended_at__gte=models.F("started_at")),
                name="stopped_period_ends_after_start",
            ),
        ]

    def __str__(self) -> str:
        return f"order {self.order_id} stopped from {self.started_at} to {self.ended_at or 'now'}"


class SilenceEnd(models.TextChoices):
    RECOVERED = "recovered", "the agent reported again"
    REPLACED = "replaced", "the order left the machine for another"
    ENDED = "ended", "the order ended"


class SilentPeriod(models.Model):
    """A stretch of time in which a running order's agent did not report, for the buyer's SLA accounting.

    ``started_at`` is the agent's last report before the silence (so the minutes count from there, not from
    when the sweep noticed, ``noticed_at``); ``ended_at`` the first report after it, or the moment the order
    left the machine. At most one period per order is open (a database constraint), opened and closed only
    with the order's health transition (``marketplace/orders/silence.py``)."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="silent_periods")
    instance = models.ForeignKey(Instance, on_delete=models.PROTECT, related_name="silent_periods")
    cause = models.CharField(max_length=32, help_text="what fell silent, e.g. lease_agent")
    started_at = models.DateTimeField(help_text="the last report before the silence")
    noticed_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    ended_by = models.CharField(max_length=16, choices=SilenceEnd.choices, blank=True, default="")

    class Meta:
        ordering = ["order", "started_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["order"], condition=models.Q(ended_at__isnull=True), name="silent_period_one_open_per_order"
            ),
            models.CheckConstraint(
                condition=models.Q(ended_at__isnull=True) | models.Q(ended_at__gte=models.F("started_at")),
                name="silent_period_ends_after_start",
            ),
        ]

    def __str__(self) -> str:
        return f"order {self.order_id} silent from {self.started_at} to {self.ended_at or 'now'}"

    def seconds(self, now: dt.datetime) -> int:
        """How long the agent was silent, up to ``now`` while the period is open."""
        return max(0, int(((self.ended_at or now) - self.started_at).total_seconds()))


class InvoiceLine(models.Model):
    """What one order costs, written when it ends: the seconds its machines ran at its locked price.

    Written in the transaction of the order's final transition, so an ended order has its line or has not
    ended; one line per order (a unique column), never edited.
    """

    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="invoice_lines")
    order = models.OneToOneField(Order, on_delete=models.PROTECT, related_name="invoice_line")
    description = models.CharField(max_length=255)
    seconds = models.PositiveIntegerField()
    price_per_hour = models.DecimalField(max_digits=14, decimal_places=6)
    amount_usd = models.DecimalField(max_digits=16, decimal_places=6)
    ended_at = models.DateTimeField()

    class Meta:
        ordering = ["ended_at", "id"]
        indexes = [models.Index(fields=["organization", "ended_at"], name="invoice_line_org_time")]

    def __str__(self) -> str:
        return f"{self.order_id}: {self.amount_usd} USD"
