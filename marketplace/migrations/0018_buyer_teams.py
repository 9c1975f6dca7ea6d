"""Buyer teams: invitations may carry any role (the service checks it fits the organisation's kind), and a
membership keeps the day it began; memberships older than this migration keep NULL, their day unknown."""

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("marketplace", "0017_offer_sale_indexes")]

    operations = [
        migrations.RemoveConstraint("invitation", "invitation_role_provider"),
        migrations.AddConstraint(
            "invitation",
            models.CheckConstraint(
                condition=models.Q(role__in=["owner", "member", "operator", "viewer"]), name="invitation_role_known"
            ),
        ),
        # Added without a default first, so existing rows stay NULL instead of all getting today's date.
        migrations.AddField("membership", "joined_at", models.DateTimeField(blank=True, null=True)),
        migrations.AlterField(
            "membership",
            "joined_at",
            models.DateTimeField(blank=True, null=True, default=django.utils.timezone.now),
        ),
    ]
