"""A password hasher for tests only: Django's PBKDF2 with few iterations.

Every persona is created with a password, and the default 1,000,000 iterations cost most of a second per user on a
slow machine. The algorithm name and hash format are Django's own, so a broker started in another process (with
the default hashers) still checks these hashes: PBKDF2 reads the iteration count from the stored hash."""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1_000
