"""The Azure sandbox's throwaway certificate authority: ARM's bearer policy refuses plain http, so the sandbox
serves HTTPS with a CA and a server certificate it makes at start-up (``sandboxes/tls.py``)."""

from __future__ import annotations

from pathlib import Path

from sandboxes.tls import write_tls


def _write_tls(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost; returns (ca, cert chain, key) paths."""
    return write_tls(directory, ca_common_name="gpu-broker Azure sandbox CA")
