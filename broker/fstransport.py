"""The filesystem task broker of the run command, with messages that appear whole.

kombu's filesystem transport creates a message's file in the queue folder and then writes it, and a consumer
polling the folder may take the file in between and read nothing (a JSONDecodeError that stops the worker).
With a pool per queue (broker/queues.py) several workers poll the one folder and it happened. Here the
message is written under a name no consumer takes (``.part``) and renamed into place, which is atomic on one
filesystem. Production uses RabbitMQ; this transport only serves the embedded default.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


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


class Transport(filesystem.Transport):
    Channel = Channel
