"""EU VAT identification numbers: each member state's format and check digits, checked offline with python-stdnum
(no outside service: VIES is not asked), and when a business buyer's VAT id moves its tax to the reverse charge.

The reverse charge (Council Directive 2006/112/EC): a service to a taxable person is supplied where that person is
established (Article 44) and the customer accounts for the VAT (Article 196), so the invoice carries no VAT, both
parties' VAT ids (Article 226(3) and (4)) and the words "Reverse charge" (Article 226(11a)). It applies when the
buyer is in a member state other than the supplier's; a buyer in the supplier's own state pays its VAT as usual.
"""

from __future__ import annotations

from dataclasses import dataclass

from stdnum.eu import vat as eu_vat
from stdnum.exceptions import InvalidChecksum, InvalidComponent, InvalidFormat, InvalidLength, ValidationError

# The 27 member states by ISO 3166-1 code (https://european-union.europa.eu/principles-countries-history/eu-countries).
EU_MEMBER_STATES = frozenset("AT BE BG CY CZ DE DK EE ES FI FR GR HR HU IE IT LT LU LV MT NL PL PT RO SE SI SK".split())
# Greece's VAT ids begin EL, not its ISO code GR (https://taxation-customs.ec.europa.eu/vies, country list).
_VAT_PREFIX = {"GR": "EL"}
_ALL_PREFIXES = frozenset(_VAT_PREFIX.get(c, c) for c in EU_MEMBER_STATES)
MAX_VAT_ID_CHARS = 32
REVERSE_CHARGE_NOTE = (
    "Reverse charge: VAT to be accounted for by the customer (Articles 44 and 196 of Council Directive 2006/112/EC)."
)


class VatIdInvalid(ValueError):
    """Not a VAT id of the member state; the message says which part is wrong."""


@dataclass(frozen=True)
class VatId:
    country: str  # the member state's ISO 3166-1 code (GR for Greece)
    number: str  # compact, with its prefix: DE136695976, EL094259216

    def __str__(self) -> str:
        return self.number


def vat_prefix(country: str) -> str:
    return _VAT_PREFIX.get(country, country)


def vat_id_parse(text: str, country: str) -> VatId:
    """The VAT id ``text`` of a buyer billed in member state ``country``, compacted (spaces, dots and dashes go; the
    prefix may be left off). Raises ``VatIdInvalid`` naming the problem: the wrong country's prefix, the format, the
    length or the check digits."""
    country = country.strip().upper()
    if country not in EU_MEMBER_STATES:
        raise VatIdInvalid(f"{country[:2]!r} is not an EU member state")
    if len(text) > MAX_VAT_ID_CHARS or not text.isascii():
        raise VatIdInvalid(f"a VAT id is at most {MAX_VAT_ID_CHARS} plain letters and digits")
    compact = "".join(c for c in text.upper() if c not in " .-/")
    if not compact.isalnum():
        raise VatIdInvalid("a VAT id is letters and digits only")
    prefix = vat_prefix(country)
    if compact[:2] == "GR" and prefix == "EL":
        compact = "EL" + compact[2:]
    if compact[:2] in _ALL_PREFIXES and compact[:2] != prefix:
        raise VatIdInvalid(f"a VAT id of {country} begins {prefix}, not {compact[:2]}")
    if not compact.startswith(prefix):
        compact = prefix + compact
    try:
        eu_vat.validate(compact)
    except InvalidLength:
        raise VatIdInvalid(f"{compact} has the wrong number of characters for a VAT id of {country}") from None
    except InvalidChecksum:
        raise VatIdInvalid(f"{compact}: its check digits are wrong (a typing error?)") from None
    except (InvalidFormat, InvalidComponent):
        raise VatIdInvalid(f"{compact} is not in the format of a VAT id of {country}") from None
    except ValidationError:
        raise VatIdInvalid(f"{compact} is not a VAT id of {country}") from None
    return VatId(country=country, number=compact)


def reverse_charge_applies(*, buyer_country: str, buyer_vat_id: str, supplier_country: str) -> bool:
    """True when the buyer is a business in another member state than the supplier's, with a VAT id of its state
    that passes the format and check-digit test. An invalid id never raises here: the buyer is then taxed as a
    consumer (the billing profile refuses such an id when it is entered)."""
    buyer_country = buyer_country.strip().upper()
    if buyer_country not in EU_MEMBER_STATES or buyer_country == supplier_country.strip().upper():
        return False
    if not buyer_vat_id.strip():
        return False
    try:
        vat_id_parse(buyer_vat_id, buyer_country)
    except VatIdInvalid:
        return False
    return True


def tax_id_for_profile(country: str, text: str) -> str:
    """The tax id a billing profile keeps: "" for none; in an EU member state its VAT id, compacted and checked
    (``VatIdInvalid`` otherwise); elsewhere the text as given (no common format to check)."""
    text = text.strip()
    if not text:
        return ""
    if country.strip().upper() in EU_MEMBER_STATES:
        return vat_id_parse(text, country).number
    return text
