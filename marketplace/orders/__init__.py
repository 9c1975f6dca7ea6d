"""Orders: placement, the state machine, provisioning with failover, termination."""
