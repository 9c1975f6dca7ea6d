"""The market's decisions on independent providers' machines, and its record of every change of their state.

Whether a machine may be sold is the market's call, so it is made here and ledgered here: staff verify or
suspend (``machine_decide``), and a change the provider side makes on its own (a verified machine whose agent
registered at a new URL leaves sale) reaches the ledger through ``providers.community.signals``, in the same
transaction.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from ledger.services import ledger_append, user_commitment
from marketplace.catalog.fanout import offers_sync_soon
from providers.community.services import MachineInvalid
from providers.community.signals import machine_state_changed
from providers.models import Machine, MachineState


def machine_decide(*, machine: Machine, state: str, by: Any, reason: str) -> Machine:
    """Staff verify (or suspend) a machine; ledgered with why, and who as an erasable commitment. Verifying
    needs the agent's latest self-test to match the listing (``providers.community.services.self_test_matches``):
    else ``MachineInvalid`` saying what differs (the reason the provider also sees on the portal), and nothing
    changes."""
    if state not in (MachineState.VERIFIED, MachineState.SUSPENDED):
        raise MachineInvalid(f"state: {state!r} is not verified or suspended")
    if not reason.strip():
        raise MachineInvalid("reason: say why, for the record")
    with transaction.atomic():
        # Read under the lock: a registration racing this decision cannot slip a failing self-test past it.
        locked = Machine.objects.select_for_update().get(pk=machine.pk)
        previous = locked.state
        if state == MachineState.VERIFIED and locked.self_test_ok is not True:
            problem = (locked.self_test or {}).get("problem") or "the agent has not registered a self-test yet"
            raise MachineInvalid(f"self_test: not verified: {problem}")
        Machine.objects.filter(pk=machine.pk).update(state=state)
        # On sale (or off it) now, not at the next round of syncs.
        offers_sync_soon(account_ids=[locked.account_id])
        _ledger_state_change(
            machine=locked, previous=previous, state=state, reason=reason, self_test_ok=machine.self_test_ok, by=by
        )
    machine.refresh_from_db()
    return machine


def _ledger_state_change(
    *, machine: Machine, previous: str, state: str, reason: str, self_test_ok: bool | None, by: Any
) -> None:
    payload: dict[str, Any] = {
        "machine": machine.key_id,
        "account": machine.account_id,
        "previous": previous,
        "state": state,
        "reason": reason,
        "self_test_ok": self_test_ok,
    }
    if by is not None:
        payload["by"] = user_commitment(by)
    ledger_append(kind=f"machine.{state}", subject=f"machine:{machine.key_id}", payload=payload)


def _on_machine_state_changed(
    sender: Any,
    *,
    machine: Machine,
    previous: str,
    state: str,
    reason: str,
    self_test_ok: bool | None,
    by: Any,
    **signal: Any,
) -> None:
    offers_sync_soon(account_ids=[machine.account_id])
    _ledger_state_change(
        machine=machine, previous=previous, state=state, reason=reason, self_test_ok=self_test_ok, by=by
    )


machine_state_changed.connect(_on_machine_state_changed, dispatch_uid="marketplace-ledger-machine-state")
