"""The run command's start-up (issue 39): one worker for every queue, steps sharing one Django process, migrate
only when a migration changed, and the start time bin/run hands over."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker.devrun import (
    OFFERS_SYNC,
    chain_address,
    chain_key,
    community_sync,
    demo_worker_command,
    migrate_if_changed,
    migrations_fingerprint,
    run_started,
    worker_commands,
)
from broker.devsteps import steps_parse
from broker.queues import QUEUES

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_worker_consumes_every_queue_with_beat_in_a_prefork_pool():
    command = demo_worker_command()

    assert sorted(command[command.index("--queues") + 1].split(",")) == sorted(QUEUES)
    assert "--beat" in command
    assert "--pool" not in command  # prefork, Celery's default: the one that enforces the tasks' time limits
    assert command[command.index("--concurrency") + 1] == "1"
    # Production's pools are untouched: one per queue.
    assert sorted(c[c.index("--queues") + 1] for c in worker_commands().values()) == sorted(QUEUES)


def test_steps_parse_splits_commands_and_reads_the_hold():
    assert steps_parse(["migrate", "--verbosity", "0"]) == (None, [["migrate", "--verbosity", "0"]])
    assert steps_parse(["--not-before", "12.5", "offers", "sync", "--then", "reconcile"]) == (
        12.5,
        [["offers", "sync"], ["reconcile"]],
    )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "a command is missing"),
        (["offers", "sync", "--then"], "a command is missing"),
        (["--then", "reconcile"], "a command is missing"),
        (["--not-before"], "--not-before needs a time"),
        (["--not-before", "soon", "reconcile"], "not 'soon'"),
    ],
)
def test_steps_parse_names_what_is_wrong(argv, says):
    with pytest.raises(ValueError, match=says):
        steps_parse(argv)


def test_devsteps_refuses_bad_arguments_before_touching_django():
    done = subprocess.run(
        [sys.executable, "-m", "broker.devsteps", "--not-before", "soon", "migrate"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--not-before needs a time in seconds since the epoch, not 'soon'" in done.stderr


def test_the_migrations_fingerprint_changes_with_a_migration_or_the_database(tmp_path):
    migrations = tmp_path / "ledger" / "migrations"
    migrations.mkdir(parents=True)
    (migrations / "0001_initial.py").write_text("operations = []\n")
    before = migrations_fingerprint(tmp_path, "sqlite:///a")

    assert migrations_fingerprint(tmp_path, "sqlite:///a") == before
    assert migrations_fingerprint(tmp_path, "sqlite:///b") != before
    (migrations / "0002_more.py").write_text("operations = []\n")
    added = migrations_fingerprint(tmp_path, "sqlite:///a")
    assert added != before
    (migrations / "0002_more.py").write_text("operations = ['changed']\n")
    assert migrations_fingerprint(tmp_path, "sqlite:///a") not in (before, added)


def test_the_start_time_is_bin_runs_when_it_is_a_time_in_the_past():
    assert run_started({"BROKER_RUN_STARTED": "990.5"}, now=1000.0) == 990.5
    assert run_started({}, now=1000.0) == 1000.0
    assert run_started({"BROKER_RUN_STARTED": "yesterday"}, now=1000.0) == 1000.0
    assert run_started({"BROKER_RUN_STARTED": "2000"}, now=1000.0) == 1000.0  # in the future: not a start


def test_the_anchor_address_is_derived_once_and_follows_a_new_key(tmp_path):
    key_file = tmp_path / "chain-anchor.key"

    address = chain_address(key_file)  # makes the key, derives in a child process, keeps the address

    assert address == chain_key(key_file)[1]
    assert (tmp_path / "chain-anchor.address").read_text().split()[1] == address
    key_file.write_text("0x" + "11" * 32 + "\n")
    assert chain_address(key_file) == chain_key(key_file)[1] != address


def test_the_last_sync_is_the_hosts_account_alone_when_the_seed_named_it():
    seeded = (
        '{"buyer": "alice", "accounts": {"aws": 1, "community": 6, "kubernetes": 7}}\n'
        "account 1 (Petra Cloud Resale/aws-sandbox (aws)): 230 offers, 0 quarantined, 0 no longer listed\n"
    )

    assert community_sync(seeded) == (*OFFERS_SYNC, "--account", "6")
    assert community_sync('{"accounts": {"aws": 1}}\n') == OFFERS_SYNC  # no hosts' account: every account
    assert community_sync("{not json\n") == OFFERS_SYNC


def test_a_second_start_skips_migrate_until_a_migration_changes(tmp_path, monkeypatch):
    # Given an embedded database of its own (settings put it in BROKER_VAR_DIR) migrated by the run command
    monkeypatch.setenv("BROKER_VAR_DIR", str(tmp_path))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert migrate_if_changed(ROOT) is True
    assert (tmp_path / "broker.sqlite3").exists()

    # When nothing changed, then the next start does not migrate
    assert migrate_if_changed(ROOT) is False

    # When the stamp names other migrations, then it migrates again
    (tmp_path / "migrated").write_text("another set of migrations\n")
    assert migrate_if_changed(ROOT) is True
    assert migrate_if_changed(ROOT) is False
