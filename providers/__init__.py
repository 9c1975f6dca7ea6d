"""Everything that talks to a provider: the adapter contract, one package per provider, and the sandboxes."""
