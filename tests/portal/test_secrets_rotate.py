"""``manage.py secrets rotate``: re-encrypt every stored secret with the newest key, so the old one can go."""

from __future__ import annotations

from io import StringIO

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command

from providers.models import ProviderAccount
from providers.secrets import SecretUnreadable, encrypted_fields
from tests.factories import ProviderAccountFactory

pytestmark = pytest.mark.django_db

OLD = Fernet.generate_key().decode()
NEW = Fernet.generate_key().decode()
CREDENTIALS = [
    {"access_key_id": "AKIDONE", "secret_access_key": "secret-one"},
    {"secret_id": "AKIDTWO", "secret_key": "secret-two"},
]


def _rotate() -> str:
    out = StringIO()
    call_command("secrets", "rotate", stdout=out)
    return out.getvalue()


@pytest.fixture
def accounts(settings):
    settings.SECRETS_KEYS = [OLD]
    made = []
    for values in CREDENTIALS:
        account = ProviderAccountFactory()
        account.set_credentials(values)
        account.save()
        made.append(account)
    ProviderAccountFactory(credentials_encrypted="")  # nothing stored: nothing to rotate
    return made


def test_add_a_new_key_rotate_then_drop_the_old_key_and_everything_still_decrypts(settings, accounts):
    before = {a.pk: a.credentials_encrypted for a in accounts}
    settings.SECRETS_KEYS = [NEW, OLD]

    output = _rotate()

    assert "providers.ProviderAccount.credentials_encrypted: 2" in output
    assert output.strip().endswith("rotated 2 secrets to the newest of 2 key(s)")
    after = dict(ProviderAccount.objects.filter(pk__in=before).values_list("pk", "credentials_encrypted"))
    assert all(after[pk] != before[pk] for pk in before)
    for token in after.values():
        Fernet(NEW.encode()).decrypt(token.encode())  # written with the new key alone
    settings.SECRETS_KEYS = [NEW]
    assert [ProviderAccount.objects.get(pk=a.pk).credentials().values for a in accounts] == CREDENTIALS


def test_without_rotating_dropping_the_old_key_loses_the_secrets(settings, accounts):
    settings.SECRETS_KEYS = [NEW]

    with pytest.raises(SecretUnreadable):
        ProviderAccount.objects.get(pk=accounts[0].pk).credentials()


def test_a_secret_no_key_reads_fails_clearly_and_nothing_is_rotated(settings, accounts):
    foreign = ProviderAccountFactory(name="foreign")
    foreign.credentials_encrypted = Fernet(Fernet.generate_key()).encrypt(b'{"k": "v"}').decode()
    foreign.save()
    before = dict(ProviderAccount.objects.values_list("pk", "credentials_encrypted"))
    settings.SECRETS_KEYS = [NEW, OLD]

    with pytest.raises(CommandError) as raised:
        _rotate()

    assert str(raised.value).startswith(
        f"no configured key decrypts 1 stored secret(s): providers.ProviderAccount {foreign.pk} (credentials_encrypted)"
    )
    assert "nothing was rotated" in str(raised.value)
    assert dict(ProviderAccount.objects.values_list("pk", "credentials_encrypted")) == before


def test_rotating_twice_is_harmless(settings, accounts):
    settings.SECRETS_KEYS = [NEW, OLD]

    _rotate()
    output = _rotate()

    assert "rotated 2 secrets" in output
    settings.SECRETS_KEYS = [NEW]
    assert ProviderAccount.objects.get(pk=accounts[1].pk).credentials().values == CREDENTIALS[1]


def test_every_encrypted_column_is_covered():
    fields = {f"{model._meta.label}.{name}" for model, name in encrypted_fields()}

    assert "providers.ProviderAccount.credentials_encrypted" in fields
