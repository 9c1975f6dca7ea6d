"""The price in force moves onto the offer (``price_since``); price points keep only the prices before it.

Each offer's newest point, which held its current price, becomes ``price_since`` and is deleted. The SQL is
plain enough for PostgreSQL and SQLite alike; reversing writes the current prices back as points.
"""

import django.utils.timezone
from django.db import migrations, models

FORWARD = [
    """
    UPDATE marketplace_offer SET price_since = COALESCE(
        (SELECT max(p.observed_at) FROM marketplace_pricepoint p WHERE p.offer_id = marketplace_offer.id),
        first_seen_at)
    """,
    """
    DELETE FROM marketplace_pricepoint
    WHERE observed_at = (SELECT o.price_since FROM marketplace_offer o WHERE o.id = offer_id)
      AND price = (SELECT o.price FROM marketplace_offer o WHERE o.id = offer_id)
    """,
]
BACKWARD = [
    """
    INSERT INTO marketplace_pricepoint (offer_id, observed_at, price, currency, price_usd)
    SELECT id, price_since, price, currency, price_usd FROM marketplace_offer
    """,
]


class Migration(migrations.Migration):
    dependencies = [
        ("marketplace", "0019_offer_sale_indexes_filter_columns"),
    ]

    operations = [
        migrations.AddField(
            model_name="offer",
            name="price_since",
            field=models.DateTimeField(default=django.utils.timezone.now),
        ),
        migrations.RunSQL(FORWARD, BACKWARD),
    ]
