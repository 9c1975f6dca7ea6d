"""The command queue of outbound-only host agents (protocol: ``protocol.py``): the broker's requests to a
machine whose agent has no public URL wait here until the agent polls for them and posts its answers.

Each step is one conditional UPDATE on the command's state, so a command is handed out once however many
polls race, and an answer and the broker giving up on the command cannot both win:

    pending --poll--> delivered --answer--> answered
    pending|delivered --the caller's deadline--> expired   (an answer after this is refused)
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from providers.community import protocol
from providers.community.services import AgentCallRefused, minute_window_admit
from providers.models import AgentCommand, AgentCommandKind, AgentCommandState, AgentPollWindow, Machine

# One poll hands out at most this many commands; the rest wait for the next poll.
MAX_COMMANDS_PER_POLL = 16
POLL_S = 1.0
# Allows a poll a second with room for a restart's burst; the setting overrides it.
DEFAULT_POLLS_PER_MINUTE = 120
# Answered and expired commands are kept this long (for staff reading the admin), then deleted.
KEEP_COMMANDS = dt.timedelta(hours=1)
OPEN = (AgentCommandState.PENDING, AgentCommandState.DELIVERED)


class CommandRefused(AgentCallRefused):
    """A poll or answer the broker does not accept."""


@dataclass(frozen=True)
class CommandAnswer:
    status: int
    answer: dict[str, Any]


def command_kind(method: str, target: str) -> AgentCommandKind:
    """What a broker -> agent request does, for the record (the agent routes by method and target). The bare
    ``GET /v1/instances`` lists every instance to describe many at once, so it is recorded as a describe; a
    search by ``order_ref`` is a find."""
    path, _, query = target.partition("?")
    path = path.rstrip("/")
    if path == "/v1/status":
        return AgentCommandKind.STATUS
    if path == "/v1/instances":
        if method == "POST":
            return AgentCommandKind.LAUNCH
        searched = "order_ref" in parse_qs(query, keep_blank_values=True)
        return AgentCommandKind.FIND if searched else AgentCommandKind.DESCRIBE
    return AgentCommandKind.TERMINATE if method == "DELETE" else AgentCommandKind.DESCRIBE


def command_enqueue(
    *, key_id: str, secret: str, method: str, target: str, body: bytes, expires_at: dt.datetime
) -> uuid.UUID | None:
    """Queue one request for the machine with ``key_id``, signed with its secret and bound to ``expires_at``;
    its id, or None when no machine has that key. Also forgets the machine's commands settled more than
    ``KEEP_COMMANDS`` ago. Commits at once: call it outside a transaction, so the agent's poll sees it."""
    machine = Machine.objects.filter(key_id=key_id).first()
    if machine is None:
        return None
    now = timezone.now()
    command_id = uuid.uuid4()
    headers = protocol.sign_command(
        key_id, secret, command_id=str(command_id), method=method, target=target, body=body,
        expires=expires_at.timestamp(), now=now.timestamp(),
    )  # fmt: skip
    AgentCommand.objects.filter(machine=machine, expires_at__lt=now - KEEP_COMMANDS).delete()
    AgentCommand.objects.create(
        id=command_id,
        machine=machine,
        kind=command_kind(method, target),
        method=method,
        target=target,
        body=body.decode(),
        headers=headers,
        created_at=now,
        expires_at=expires_at,
    )
    return command_id


def command_answer_get(*, command_id: uuid.UUID) -> CommandAnswer | None:
    """The agent's answer to a command, or None while it has none."""
    row = (
        AgentCommand.objects.filter(pk=command_id, state=AgentCommandState.ANSWERED)
        .only("answer_status", "answer")
        .first()
    )
    if row is None or row.answer_status is None:
        return None
    return CommandAnswer(row.answer_status, dict(row.answer or {}))


def command_expire(*, command_id: uuid.UUID, now: dt.datetime | None = None) -> bool:
    """The caller stops waiting: True when the command is now expired (an answer from here on is refused),
    False when the agent's answer landed first (read it with ``command_answer_get``)."""
    return bool(
        AgentCommand.objects.filter(pk=command_id, state__in=OPEN).update(
            state=AgentCommandState.EXPIRED, answered_at=now or timezone.now()
        )
    )


def commands_deliver(*, machine: Machine, now: dt.datetime | None = None) -> list[dict[str, Any]]:
    """Hand the machine's pending commands to its agent's poll, oldest first, each once: claimed under
    ``SKIP LOCKED`` and moved to ``delivered`` in one transaction, so a racing poll gets the others. A
    command past its expiry is expired, not handed out. At most ``polls per minute`` polls are answered
    (``CommandRefused`` 429 ``too_many_polls`` beyond, and nothing is handed out)."""
    moment = now or timezone.now()
    if not _poll_admitted(machine, moment):
        raise CommandRefused(
            "too_many_polls", f"at most {_polls_per_minute()} polls a minute; poll every {POLL_S:g} s", status=429
        )
    AgentCommand.objects.filter(machine=machine, state=AgentCommandState.PENDING, expires_at__lte=moment).update(
        state=AgentCommandState.EXPIRED
    )
    with transaction.atomic():
        rows = list(
            AgentCommand.objects.select_for_update(skip_locked=True)
            .filter(machine=machine, state=AgentCommandState.PENDING, expires_at__gt=moment)
            .order_by("created_at", "pk")[:MAX_COMMANDS_PER_POLL]
        )
        AgentCommand.objects.filter(pk__in=[r.pk for r in rows], state=AgentCommandState.PENDING).update(
            state=AgentCommandState.DELIVERED, delivered_at=moment
        )
    return [
        {"id": str(r.pk), "method": r.method, "target": r.target, "body": r.body, "headers": r.headers} for r in rows
    ]


def command_answer(
    *, machine: Machine, command_id: uuid.UUID, status: int, answer: dict[str, Any], now: dt.datetime | None = None
) -> None:
    """Record the agent's answer to one of its machine's commands. Raises ``CommandRefused``: 404
    ``not_found`` for a command of another machine or none, 409 ``expired`` when the broker already gave up
    on it (or it was answered already): that answer is ignored."""
    moment = now or timezone.now()
    answered = AgentCommand.objects.filter(pk=command_id, machine=machine, state__in=OPEN).update(
        state=AgentCommandState.ANSWERED, answered_at=moment, answer_status=status, answer=answer
    )
    if answered:
        return
    if not AgentCommand.objects.filter(pk=command_id, machine=machine).exists():
        raise CommandRefused("not_found", "no such command for this machine", status=404)
    raise CommandRefused("expired", "the broker no longer waits for this command", status=409)


def _polls_per_minute() -> int:
    return int(getattr(settings, "AGENT_POLLS_PER_MINUTE", DEFAULT_POLLS_PER_MINUTE))


def _poll_admitted(machine: Machine, now: dt.datetime) -> bool:
    """Count one poll in the machine's one-minute window, the heartbeat limit's scheme on a row of its own."""
    AgentPollWindow.objects.bulk_create([AgentPollWindow(machine=machine)], ignore_conflicts=True)
    rows = AgentPollWindow.objects.filter(machine=machine)
    return minute_window_admit(rows, start="window_start", count="window_count", limit=_polls_per_minute(), now=now)
