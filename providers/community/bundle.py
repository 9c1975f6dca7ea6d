"""The lease agent as one file a fresh machine can run: a zipapp of ``lease.py``, its executors
(``executor_base.py``, ``lease_executors.py``), ``protocol.py`` and the bounded JSON reader they use
(``untrusted/jsonbody.py``). Each holds to the standard library, since a fresh image has nothing else.

The boot script downloads it from ``/agent/v1/lease/agent.pyz`` and checks it against the SHA-256 the broker
put in the script, so a changed file in transit (or on a mirror) is refused before it runs. The archive is
built deterministically (fixed timestamps, sorted entries), so its hash changes only when the code does.
"""

from __future__ import annotations

import functools
import hashlib
import io
import zipfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_SOURCES = {
    "providers/community/protocol.py": _HERE / "protocol.py",
    "providers/community/lease.py": _HERE / "lease.py",
    "providers/community/executor_base.py": _HERE / "executor_base.py",
    "providers/community/lease_executors.py": _HERE / "lease_executors.py",
    "untrusted/__init__.py": _HERE.parent.parent / "untrusted" / "__init__.py",
    "untrusted/jsonbody.py": _HERE.parent.parent / "untrusted" / "jsonbody.py",
}
_FIXED = {
    "providers/__init__.py": b"",
    "providers/community/__init__.py": b"",
    "__main__.py": b"import sys\nfrom providers.community.lease import main\nsys.exit(main())\n",
}
_EPOCH = (2026, 1, 1, 0, 0, 0)


@functools.cache
def agent_bundle() -> bytes:
    """The zipapp's bytes (``#!/usr/bin/env python3`` then a zip archive), cached for the process's life."""
    buffer = io.BytesIO()
    buffer.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        entries = {**_FIXED, **{name: path.read_bytes() for name, path in _SOURCES.items()}}
        for name in sorted(entries):
            data = entries[name]
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def agent_bundle_sha256() -> str:
    return hashlib.sha256(agent_bundle()).hexdigest()
