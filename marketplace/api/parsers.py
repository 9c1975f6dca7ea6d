"""The API's JSON parser: DRF's, with the body's size and nesting bounded before the decoder runs."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, get_encoding

from untrusted.jsonbody import bounded_json

# The deepest request the API documents is a procurement: demands -> a demand -> launch -> ingress -> a rule
# (five levels). Eight times that leaves room for any launch configuration and none for a stack overflow.
MAX_DEPTH = 40


class BoundedJSONParser(JSONParser):
    """Reads at most ``DATA_UPLOAD_MAX_MEMORY_SIZE`` bytes (DRF reads the request stream itself, so Django's own
    check on ``request.body`` never runs) nested at most ``MAX_DEPTH`` deep; either limit, invalid JSON, ``NaN``
    or ``Infinity`` is a ``ParseError`` (a 400 ``parse_error`` naming the limit)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict[str, Any] | None = None) -> Any:
        limit = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise ParseError(f"JSON parse error - the body is over {limit} bytes, the most the API reads")
        encoding = get_encoding(parser_context or {})  # refuses byte codecs such as bz2_codec
        try:
            text = raw.decode(encoding)
        except UnicodeDecodeError as exc:
            raise ParseError(f"JSON parse error - the body is not {encoding} text: {exc}") from None
        try:
            return bounded_json(text, max_bytes=limit, max_depth=MAX_DEPTH)
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
