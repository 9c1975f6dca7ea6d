"""Interruptible rentals with bids (issue 19): an order's bid, its notice of preemption, the notice's webhook."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("marketplace", "0024_workstation_gpus"),
    ]

    operations = [
        migrations.AddField(
            model_name="order",
            name="bid_per_gpu_hour",
            field=models.DecimalField(blank=True, decimal_places=4, max_digits=10, null=True),
        ),
        migrations.AddField(
            model_name="order",
            name="preempt_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="order",
            name="preempted_for",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="preempted_orders",
                to="marketplace.attempt",
            ),
        ),
        migrations.AlterField(
            model_name="webhookdelivery",
            name="event_type",
            field=models.CharField(
                choices=[
                    ("order.placed", "order placed"),
                    ("order.provisioning", "order provisioning"),
                    ("order.running", "order running"),
                    ("order.terminating", "order terminating"),
                    ("order.terminated", "order terminated"),
                    ("order.failed", "order failed"),
                    ("order.cancelled", "order cancelled"),
                    ("order.preemption_notice", "order outbid: its machine is taken at the notice's end"),
                    ("instance.launched", "instance launched"),
                    ("instance.running", "instance running"),
                    ("instance.ready", "instance ready: GPUs checked, workload started, SSH answering"),
                    ("instance.failed", "instance failed before running"),
                    ("instance.lost", "instance taken away by the provider"),
                    ("instance.terminated", "instance terminated"),
                    ("ping", "ping (sent on request only)"),
                ],
                max_length=32,
            ),
        ),
        migrations.AddIndex(
            model_name="order",
            index=models.Index(
                condition=models.Q(("preempt_at__isnull", False)), fields=["preempt_at"], name="order_preemption_due"
            ),
        ),
    ]
