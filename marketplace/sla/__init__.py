"""SLAs per offer, availability measured by the broker, and the credits paid when an order falls below its SLA
(issue 38, parts 3 and 4). ``published`` is what each offer states, ``availability`` the arithmetic, ``probe`` the
SSH reachability check, ``credits`` the money, ``selectors`` the reads."""
