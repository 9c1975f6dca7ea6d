"""Stripe's currency rules as data: which currencies a charge may use, which have no minor unit, and the smallest
charge in each (https://docs.stripe.com/currencies).
"""

from __future__ import annotations

# The presentment currencies for card payments (https://docs.stripe.com/currencies#presentment-currencies).
SUPPORTED = frozenset(
    """
    usd aed afn all amd ang aoa ars aud awg azn bam bbd bdt bgn bhd bif bmd bnd bob brl bsd bwp byn bzd cad cdf chf clp
    cny cop crc cve czk djf dkk dop dzd egp etb eur fjd fkp gbp gel gip gmd gnf gtq gyd hkd hnl htg huf idr ils inr isk
    jmd jod jpy kes kgs khr kmf krw kwd kyd kzt lak lbp lkr lrd lsl mad mdl mga mkd mmk mnt mop mur mvr mwk mxn myr mzn
    nad ngn nio nok npr nzd omr pab pen pgk php pkr pln pyg qar ron rsd rub rwf sar sbd scr sek sgd shp sle sos srd std
    szl thb tjs tnd top try ttd twd tzs uah ugx uyu uzs vnd vuv wst xaf xcd xof xpf yer zar zmw
    """.split()
)
# Amounts in these are whole units: 50 is ¥50 (https://docs.stripe.com/currencies#zero-decimal).
ZERO_DECIMAL = frozenset("bif clp djf gnf jpy kmf krw mga pyg rwf ugx vnd vuv xaf xof xpf".split())
# Three-decimal currencies take amounts whose last digit is 0 (https://docs.stripe.com/currencies#three-decimal).
THREE_DECIMAL = frozenset("bhd jod kwd omr tnd".split())
# The smallest charge, in minor units, for the currencies Stripe's table names
# (https://docs.stripe.com/currencies#minimum-and-maximum-charge-amounts). Elsewhere Stripe's floor is the
# equivalent of US$0.50 in the account's settlement currency at the day's rate, which the sandbox cannot know, so it
# checks only these.
MINIMUM_CHARGE = {
    "usd": 50,
    "aed": 200,
    "aud": 50,
    "bgn": 100,
    "brl": 50,
    "cad": 50,
    "chf": 50,
    "czk": 1500,
    "dkk": 250,
    "eur": 50,
    "gbp": 30,
    "hkd": 400,
    "huf": 17500,
    "inr": 50,
    "jpy": 50,
    "mxn": 1000,
    "myr": 200,
    "nok": 300,
    "nzd": 50,
    "pln": 200,
    "ron": 200,
    "sek": 300,
    "sgd": 50,
    "thb": 1000,
}


def display(amount: int, currency: str) -> str:
    """``amount`` minor units as Stripe writes them in messages: ``0.50 usd``, ``50 jpy``."""
    if currency in ZERO_DECIMAL:
        return f"{amount} {currency}"
    places = 3 if currency in THREE_DECIMAL else 2
    whole, part = divmod(amount, 10**places)
    return f"{whole}.{part:0{places}d} {currency}"
