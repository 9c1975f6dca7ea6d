"""Simulated independent hosts (stand in for the machines ``providers.community`` talks to): reference agents
run in one process. ``hosts`` starts them; see sandboxes/README.md."""
