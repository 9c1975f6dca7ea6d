from django.db import migrations


def seed(apps, schema_editor):
    from marketplace.catalog.gpu_specs import gpu_models_upsert

    gpu_models_upsert(apps.get_model("marketplace", "GpuModel"))


class Migration(migrations.Migration):
    dependencies = [("marketplace", "0001_initial")]

    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
