"""Numbers from outside, checked as text before anything converts them.

Python converts more than people type: ``int()`` and ``Decimal()`` read any Unicode decimal digit (Arabic-Indic
or fullwidth "12" is 12), ``Decimal("1e1000000")`` is a valid number whose conversion to an integer holds the
interpreter for about a minute, and ``float("1e400")`` is infinity. Every numeric input of the API and the forms
is therefore written with ASCII digits, a short text with an exponent of at most two digits, finite, and inside
a range that each field states: an out-of-range value is refused naming that range, before any conversion.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

from django import forms
from rest_framework import serializers

MAX_TEXT = 40
# The largest values the money fields' digits allow (the API's max_digits less its decimal places), stated so a
# refusal names the range; ids are 64-bit (BigAutoField).
MAX_PRICE_PER_HOUR = Decimal("99999999")
MAX_PRICE_PER_JOB = Decimal("9999999999")
MAX_BUDGET = Decimal("999999999999")
MAX_ID = 2**63 - 1
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,2})?", re.ASCII)
_WHOLE = re.compile(r"[+-]?[0-9]{1,19}(?:\.0*)?", re.ASCII)  # Django and DRF read "8.0" as 8
_BIG_EXPONENT = re.compile(r"[eE][+-]?[0-9]{3,}")
_NOT_FINITE = frozenset({"nan", "snan", "inf", "infinity"})


def _span(low: Any, high: Any) -> str:
    return f"from {low} to {high}"


def number_problem(value: Any, *, low: Any, high: Any, whole: bool, in_range: bool = True) -> str | None:
    """Why ``value`` (text, or a number a JSON parser made) is not a number in ``low..high``, or None when the
    field's own conversion may run on it. The text is checked as written: a minus sign is refused below a
    field whose range starts at 0 or above, so ``-0`` is out of range rather than silently 0. With
    ``in_range=False`` an ordinary number outside the range passes, for a caller whose own validators name it."""
    expected = f"a {'whole ' if whole else ''}number {_span(low, high)}"
    if isinstance(value, bool):
        return expected
    if isinstance(value, float):
        return None if math.isfinite(value) and (low <= value <= high or not in_range) else expected
    if isinstance(value, int):  # JSON reads a 4,000-digit integer exactly; no field takes one beyond 64 bits
        return None if low <= value <= high or (not in_range and abs(value) < 2**63) else expected
    if not isinstance(value, str):
        return None  # the field's own conversion refuses other types
    text = value.strip()
    if not text:
        return None  # empty: the field's required/empty handling applies
    if not in_range:
        # Only what the field's own conversion would take wrongly or slowly is refused here; an ordinary
        # mistake ("abc", "2.5" for a count, -1) gets the field's own message.
        if not text.isascii() or len(text) > MAX_TEXT or _BIG_EXPONENT.search(text):
            return f"{expected}, written with the digits 0-9"
        if text.lstrip("+-").lower() in _NOT_FINITE:
            return expected
        if text.startswith("-") and low >= 0 and _DECIMAL.fullmatch(text) and Decimal(text) == 0:
            return expected
        return None
    if len(text) > MAX_TEXT or not (_WHOLE if whole else _DECIMAL).fullmatch(text):
        return f"{expected}, written with the digits 0-9"
    if text.startswith("-") and low >= 0:
        return expected
    number = Decimal(text)  # safe now: at most 40 ASCII characters and a two-digit exponent
    return None if low <= number <= high or not in_range else expected


def _whole(field: Any) -> bool:
    return isinstance(field, forms.IntegerField | serializers.IntegerField) and not isinstance(
        field, forms.DecimalField | forms.FloatField
    )


class _Bounded:
    """Requires ``min_value`` and ``max_value`` and checks the input's text (``number_problem``) first."""

    min_value: Any
    max_value: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("min_value") is None or kwargs.get("max_value") is None:
            raise TypeError(f"{type(self).__name__} needs min_value and max_value")
        super().__init__(*args, **kwargs)

    def _problem(self, value: Any) -> str | None:
        # An ordinary number out of range is left to the field's own min/max validators and their messages.
        return number_problem(value, low=self.min_value, high=self.max_value, whole=_whole(self), in_range=False)


class _BoundedForm(_Bounded):
    def to_python(self, value: Any) -> Any:
        if problem := self._problem(value):
            raise forms.ValidationError(problem, code="invalid")
        return super().to_python(value)  # type: ignore[misc]


class _BoundedSerializer(_Bounded):
    def to_internal_value(self, data: Any) -> Any:
        if problem := self._problem(data):
            raise serializers.ValidationError(problem, code="invalid")
        return super().to_internal_value(data)  # type: ignore[misc]


class IntegerFormField(_BoundedForm, forms.IntegerField):
    pass


class DecimalFormField(_BoundedForm, forms.DecimalField):
    pass


class FloatFormField(_BoundedForm, forms.FloatField):
    pass


class IntegerSerializerField(_BoundedSerializer, serializers.IntegerField):
    pass


class DecimalSerializerField(_BoundedSerializer, serializers.DecimalField):
    pass


class FloatSerializerField(_BoundedSerializer, serializers.FloatField):
    pass
