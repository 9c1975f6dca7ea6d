"""The search orders' partial indexes over the offers for sale, and the unit prices 0016 filled made required."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("marketplace", "0016_offer_unit_prices")]

    operations = [
        migrations.AlterField("offer", "price_per_gpu_usd", models.FloatField()),
        migrations.AlterField("offer", "usd_per_tflop_hour", models.FloatField()),
        migrations.AddIndex(
            "offer",
            models.Index(condition=models.Q(status="available"), fields=["price_usd", "id"], name="offer_sale_price"),
        ),
        migrations.AddIndex(
            "offer",
            models.Index(
                condition=models.Q(status="available"), fields=["price_per_gpu_usd", "id"], name="offer_sale_gpuprice"
            ),
        ),
        migrations.AddIndex(
            "offer",
            models.Index(
                condition=models.Q(status="available"), fields=["usd_per_tflop_hour", "id"], name="offer_sale_tflops"
            ),
        ),
    ]
