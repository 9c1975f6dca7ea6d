"""What makes a rented machine usable: the buyer's SSH keys, launch configurations and their named
templates, and the lease each provisioning attempt opens for the agent on the machine."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from marketplace.models.orders import Attempt, Order
from marketplace.models.organizations import Organization


class SshKey(models.Model):
    """A buyer organisation's SSH public key, validated (``providers.sshkeys``) and shown by fingerprint.

    Launches snapshot the keys they install into their configuration, so deleting a key changes no order.
    """

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="ssh_keys")
    name = models.CharField(max_length=80)
    key_type = models.CharField(max_length=48)
    public_key = models.TextField(help_text="the canonical '<type> <base64>' form, without the comment")
    fingerprint = models.CharField(max_length=64, help_text="SHA256:..., as ssh-keygen -lf prints it")
    bits = models.PositiveIntegerField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="ssh_keys")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["organization", "name"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "fingerprint"], name="ssh_key_unique_fingerprint"),
            models.UniqueConstraint(fields=["organization", "name"], name="ssh_key_unique_name"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.fingerprint})"


class LaunchConfiguration(models.Model):
    """What an order launches, immutable once made: image, workload, disk, ports and who may reach them, the
    SSH keys (snapshotted) and the spend cap (``spec``), and the secret values apart (``secrets_encrypted``).

    ``sha256`` commits to the whole configuration, secrets included, salted with ``salt``: the ledger holds
    it, so a receipt proves what ran without revealing it, and nobody can test guesses of a secret against
    it without the salt, which only the buyer's organisation sees.
    """

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="launch_configurations")
    spec = models.JSONField(help_text="the configuration without secret values")
    secrets_encrypted = models.TextField(blank=True, default="")
    salt = models.CharField(max_length=32)
    sha256 = models.CharField(max_length=64)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"launch configuration {self.public_id}"


class LaunchTemplate(models.Model):
    """A named launch configuration an organisation reuses. Saving a template makes a new configuration and
    points the template at it; orders keep the configuration they were placed with."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="launch_templates")
    name = models.CharField(max_length=80)
    description = models.CharField(max_length=255, blank=True, default="")
    configuration = models.ForeignKey(LaunchConfiguration, on_delete=models.PROTECT, related_name="templates")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["organization", "name"]
        constraints = [models.UniqueConstraint(fields=["organization", "name"], name="launch_template_unique_name")]

    def __str__(self) -> str:
        return self.name


class LeaseState(models.TextChoices):
    WAITING = "waiting", "waiting for the machine's agent"
    CLAIMED = "claimed", "agent started"
    READY = "ready", "ready"
    FAILED = "failed", "failed on the machine"
    REFUSED = "refused", "refused: not what the order bought"
    ENDED = "ended", "ended"


class Lease(models.Model):
    """The agent's side of one provisioning attempt: the one-time boot token the user data carries (only
    its SHA-256 here), the key the agent gets for it, and what the agent reported.

    Opened with the attempt, before the provider hears of it. The order becomes running when the lease is
    ready (GPUs as ordered, workload started, SSH listening); a lease that fails, is refused or stays silent
    past ``boot_deadline`` fails its attempt and the machine is terminated.
    """

    attempt = models.OneToOneField(Attempt, on_delete=models.CASCADE, related_name="lease")
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="leases")
    token_hash = models.CharField(max_length=64, unique=True)
    token_expires_at = models.DateTimeField()
    state = models.CharField(max_length=16, choices=LeaseState.choices, default=LeaseState.WAITING)
    claimed_at = models.DateTimeField(null=True, blank=True)
    # NULL until claimed: the partial unique index must skip leases without a key.
    key_id = models.CharField(max_length=40, null=True, blank=True, unique=True)
    secret_encrypted = models.TextField(blank=True, default="")
    boot_deadline = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    failure_stage = models.CharField(max_length=16, blank=True, default="")
    failure_reason = models.TextField(blank=True, default="")
    gpus = models.JSONField(default=list, blank=True, help_text="the GPUs the agent saw")
    workload_detail = models.CharField(max_length=2000, blank=True, default="")
    ssh_host = models.CharField(max_length=255, blank=True, default="")
    ssh_port = models.PositiveIntegerField(null=True, blank=True)
    ssh_user = models.CharField(max_length=32, blank=True, default="")
    host_keys = models.JSONField(default=list, blank=True, help_text="[{type, public_key, fingerprint}]")
    ports = models.JSONField(default=dict, blank=True, help_text="the machine's port -> where buyers reach it")
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The workload's recent output, as the agent's latest heartbeat carried it (bounded; issue 36).
    workload_log = models.TextField(blank=True, default="")
    workload_log_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["state", "boot_deadline"], name="lease_state_deadline")]

    def __str__(self) -> str:
        return f"lease of attempt {self.attempt_id} ({self.state})"


class LeaseHeartbeat(models.Model):
    """One telemetry report from a lease agent: per-GPU figures and their summary, as independent hosts send."""

    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="heartbeats")
    at = models.DateTimeField()
    utilization_pct = models.DecimalField(max_digits=5, decimal_places=1)
    temperature_c = models.DecimalField(max_digits=5, decimal_places=1)
    power_w = models.DecimalField(max_digits=9, decimal_places=1)
    gpus = models.JSONField(default=list)
    workload_state = models.CharField(max_length=16, blank=True, default="")
    # Who measured: the lease agent on the machine, or a Kubernetes seller's DCGM exporter reading the GPUs the
    # order's pod holds (marketplace/orders/cluster_telemetry.py).
    source = models.CharField(
        max_length=8, choices=[("agent", "lease agent"), ("dcgm", "DCGM exporter")], default="agent"
    )

    class Meta:
        indexes = [models.Index(fields=["lease", "at"], name="lease_heartbeat_time")]

    def __str__(self) -> str:
        return f"{self.lease_id} at {self.at}"
