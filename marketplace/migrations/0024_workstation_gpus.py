"""Seed the consumer and workstation GPUs (RTX 3090, RTX 4090, RTX A6000, RTX 6000 Ada) into the spec table,
so independent hosts with such cards can list. Upserts by key: safe on a database 0002 already seeded.
Reversing keeps the rows: offers and quotes may point at them."""

from django.db import migrations

WORKSTATION_KEYS = frozenset({"RTX-3090", "RTX-4090", "RTX-A6000", "RTX-6000-ADA"})


def seed(apps, schema_editor):
    from marketplace.catalog.gpu_specs import gpu_models_upsert

    gpu_models_upsert(apps.get_model("marketplace", "GpuModel"), keys=WORKSTATION_KEYS)


class Migration(migrations.Migration):
    dependencies = [("marketplace", "0023_gpu_holds")]

    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
