"""The filesystem task broker of the run command, with messages that appear whole.

kombu's filesystem transport creates a message's file in the queue folder and then writes it, and a consumer
polling the folder may take the file in between and read nothing (a JSONDecodeError that stops the worker).
With a pool per queue (broker/queues.py) several workers poll the one folder and it happened. Here the
message is written under a name no consumer takes (``.part``) and renamed into place, which is atomic on one
filesystem. Production uses RabbitMQ; this transport only serves the embedded default.

The exchange tables (which queues an exchange feeds) had the same race: a worker binding a queue created the
table's file and then locked and wrote it, so another worker starting at the same moment could read it empty
and stop at start-up. Here a table file is created without truncation and read under its lock, and an empty
one is an empty table.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem, virtual
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + ".part"  # a consumer takes only names ending in ".<queue>.msg"
        try:
            with open(partial, "wb") as out:
                out.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def get_table(self, exchange: str) -> list[Any]:
        file = self._exchange_file(exchange)
        try:
            with file.open("rb") as f_obj:
                filesystem.lock(f_obj, filesystem.LOCK_SH)
                try:
                    return _table(f_obj.read())
                finally:
                    filesystem.unlock(f_obj)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ChannelError(f"Cannot open {file}") from exc

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        file = self._exchange_file(exchange)
        self.control_folder.mkdir(exist_ok=True)
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        try:
            # "a+b" creates the file if it is missing without emptying one another worker has written.
            with file.open("a+b", buffering=0) as f_obj:
                filesystem.lock(f_obj, filesystem.LOCK_EX)
                try:
                    f_obj.seek(0)
                    queues = _table(f_obj.read())
                    if binding not in queues:
                        queues.insert(0, binding)
                        f_obj.seek(0)
                        f_obj.truncate()
                        f_obj.write(str_to_bytes(dumps(queues)))
                finally:
                    filesystem.unlock(f_obj)
        except OSError as exc:
            raise ChannelError(f"Cannot open {file}") from exc


def _table(raw: bytes) -> list[Any]:
    """An exchange table's bindings; a file just created and not yet written is an empty table."""
    text = bytes_to_str(raw)
    return [filesystem.exchange_queue_t(*q) for q in loads(text)] if text.strip() else []


class Transport(filesystem.Transport):
    Channel = Channel

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        # kombu's filesystem transport shares one record of declared bindings across the process, so a
        # connection to another folder skipped writing its exchange table and its messages went nowhere.
        # Each connection keeps its own; a binding already in the table file is kept once.
        self.state = virtual.BrokerState()
