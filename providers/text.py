"""What text from outside may contain. Two rules: any stored string must encode as UTF-8 and hold no NUL
(PostgreSQL's text and jsonb refuse NUL; a lone surrogate makes the driver raise), and a *name* another person
reads (a key's, a template's, a machine's) holds no control or format characters, which can reorder or hide what
the reader sees (U+202E RIGHT-TO-LEFT OVERRIDE turns ``invoice\u202egpj.exe`` into "invoiceexe.jpg")."""

from __future__ import annotations

import unicodedata

# Unicode general categories (UAX #44, "General_Category Values"): Cc control, Cf format (bidi overrides and
# isolates, zero-width joiners), Cs surrogate, Co private use.
_NAME_REFUSED = {"Cc", "Cf", "Cs", "Co"}


def storable_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text, or None."""
    if "\x00" in value:
        return "no NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"not valid Unicode (a lone surrogate at character {exc.start + 1})"
    return None


def name_problem(value: str) -> str | None:
    """Why ``value`` cannot be a name people read, or None: storable, and no control, format, surrogate or
    private-use character."""
    problem = storable_problem(value)
    if problem:
        return problem
    for position, char in enumerate(value, start=1):
        if unicodedata.category(char) in _NAME_REFUSED:
            return f"no control or invisible formatting characters (U+{ord(char):04X} at character {position})"
    return None
