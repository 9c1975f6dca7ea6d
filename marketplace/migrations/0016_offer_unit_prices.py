"""Offers store their price per GPU-hour and per TFLOP-hour (filled here; 0017 makes them required and indexes
them: on PostgreSQL a table cannot be altered in the transaction that updated it)."""

from django.db import migrations, models
from django.db.models import F, FloatField, OuterRef, Subquery
from django.db.models.functions import Cast, Coalesce, NullIf


def backfill(apps, schema_editor):
    Offer = apps.get_model("marketplace", "Offer")
    GpuModel = apps.get_model("marketplace", "GpuModel")
    tflops = Subquery(
        GpuModel.objects.filter(pk=OuterRef("gpu_model_id")).values("fp16_dense_tflops")[:1],
        output_field=FloatField(),
    )
    Offer.objects.update(price_per_gpu_usd=Cast("price_usd", FloatField()) / Cast("gpu_count", FloatField()))
    Offer.objects.update(usd_per_tflop_hour=F("price_per_gpu_usd") / Coalesce(NullIf(tflops, 0.0), 1.0))


class Migration(migrations.Migration):
    dependencies = [("marketplace", "0015_webhooks")]

    operations = [
        migrations.AddField("offer", "price_per_gpu_usd", models.FloatField(null=True)),
        migrations.AddField("offer", "usd_per_tflop_hour", models.FloatField(null=True)),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
