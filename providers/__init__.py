"""Everything that talks to a provider: the adapter contract and one package per provider (their emulators live in
``sandboxes``, outside production)."""
