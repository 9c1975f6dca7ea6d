"""What the independent providers' side tells the market about, without importing it (the market's side is above).

``machine_state_changed`` is sent inside the transaction that changed a machine's state, so a receiver's writes
(the market's ledger entry, ``marketplace.machines``) commit or roll back with the change. Arguments: ``machine``
(the locked row), ``previous`` and ``state`` (``MachineState`` values), ``reason``, ``self_test_ok`` and ``by``
(the staff user who decided, or None when the machine's own report caused it).
"""

from __future__ import annotations

from django.dispatch import Signal

machine_state_changed = Signal()
