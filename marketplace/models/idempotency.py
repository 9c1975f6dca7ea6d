"""Responses remembered under a client's ``Idempotency-Key`` so a retried creating POST is answered, not redone."""

from __future__ import annotations

from django.db import models

from marketplace.models.organizations import Organization


class IdempotentResponse(models.Model):
    """The first response to ``(organization, operation, key)``. ``request_hash`` is the SHA-256 of the body
    it answered: the same key with another body is a client error, not a replay. Kept for
    ``IDEMPOTENCY_KEEP_HOURS``; orders keep their own key on the order row for as long as the order lives."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    operation = models.CharField(max_length=64)
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField()
    body = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "operation", "key"], name="idempotent_response_unique")
        ]

    def __str__(self) -> str:
        return f"{self.operation} {self.key}"
