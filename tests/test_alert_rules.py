"""The Prometheus alerting rules in deploy/prometheus/ (issue 38): they load, every alert fires and stays quiet at
the edges its test file states, a broken threshold or hold time is caught, and they name only metrics the broker
exports (or the fleet and SLA metrics whose collectors land with those features).

The cases live in deploy/prometheus/alerts.test.yml, promtool's own format. They run twice: through promtool where
it is installed (``.ci/run`` installs Debian's ``prometheus`` package), and always through tests/promrules.py, the
same cases evaluated in Python for the subset of PromQL the rules keep to."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from django.db import transaction
from prometheus_client.parser import text_string_to_metric_families

from ledger.checkpoints import ledger_checkpoint_and_anchor
from ledger.services import ledger_append
from tests.pending_metrics import PENDING_METRICS
from tests.promrules import OutsideSubset, parse_expr, run_rule_tests

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"
RULES = DEPLOY / "alerts.yml"
CASES = DEPLOY / "alerts.test.yml"
OPERATIONS = Path(__file__).resolve().parent.parent / "docs" / "OPERATIONS.md"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: prometheus)")

_METRIC = re.compile(r"\bbroker_[a-z0-9_]+")
_FLIPPED = {">=": ">", "<=": "<", ">": ">=", "<": "<=", "==": "!=", "!=": "=="}
_COMPARISON = re.compile(r"\s(>=|<=|==|!=|>|<)\s")


def _rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False)


def _mutants() -> list[tuple[str, str, str]]:
    """(alert, what changed, the rules file with only that change): each comparison turned to its neighbour
    (> to >=, == to !=, ...), and each hold time made a minute longer."""
    text = RULES.read_text()
    mutants = []
    for rule in _rules():
        expr_line = f"expr: {rule['expr']}"
        assert text.count(expr_line) == 1, rule["alert"]
        op = _COMPARISON.search(rule["expr"])
        assert op is not None, rule["alert"]
        flipped = rule["expr"][: op.start(1)] + _FLIPPED[op.group(1)] + rule["expr"][op.end(1) :]
        mutants.append(
            (rule["alert"], f"{op.group(1)} -> {_FLIPPED[op.group(1)]}", text.replace(expr_line, f"expr: {flipped}"))
        )
        if rule.get("for"):
            start = text.index(expr_line)
            hold = f"for: {rule['for']}"
            at = text.index(hold, start)
            longer = f"for: {int(rule['for'].rstrip('m')) + 1}m"
            mutants.append((rule["alert"], f"{hold} -> {longer}", text[:at] + longer + text[at + len(hold) :]))
    return mutants


def _write_mutant(tmp_path: Path, rules: str) -> Path:
    (tmp_path / "alerts.yml").write_text(rules)
    shutil.copy(CASES, tmp_path / "alerts.test.yml")
    return tmp_path / "alerts.test.yml"


def test_every_alert_has_a_hold_severity_and_annotations_that_say_what_to_do():
    rules = _rules()
    assert len(rules) == len({rule["alert"] for rule in rules}) >= 10
    for rule in rules:
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}, rule["alert"]
        notes = rule["annotations"]
        assert set(notes) == {"summary", "description", "runbook"}, rule["alert"]
        assert notes["runbook"] == "docs/OPERATIONS.md#alerts"
        assert len(notes["description"]) > 60, rule["alert"]


def test_every_rule_keeps_to_the_subset_the_python_evaluator_checks():
    for rule in _rules():
        parse_expr(rule["expr"])  # raises OutsideSubset otherwise


def test_the_python_evaluator_refuses_promql_outside_its_subset():
    for expr in ("rate(broker_failovers_total[5m]) > 0", "broker_orders > bool 0", "broker_orders{state=~'r.*'} > 0",
                 "sum(broker_orders) by (state) > 0", "broker_orders[5m] > 0"):  # fmt: skip
        with pytest.raises(OutsideSubset):
            parse_expr(expr)


def test_each_alert_is_tested_firing_and_quiet():
    cases = [case for test in yaml.safe_load(CASES.read_text())["tests"] for case in test["alert_rule_test"]]
    for rule in _rules():
        mine = [case for case in cases if case["alertname"] == rule["alert"]]
        assert any(case["exp_alerts"] for case in mine), f"{rule['alert']} is never expected to fire"
        assert any(not case["exp_alerts"] for case in mine), f"{rule['alert']} is never expected to stay quiet"


def test_the_rule_tests_pass_in_python():
    assert run_rule_tests(CASES) == []


@needs_promtool
def test_promtool_accepts_the_rules_and_the_configuration_and_passes_the_rule_tests():
    checked = _promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in checked.stdout
    # --syntax-only: the bearer token file the configuration names exists on the Prometheus host, not here.
    config = _promtool("check", "config", "--syntax-only", str(DEPLOY / "prometheus.yml"))
    assert config.returncode == 0, config.stdout + config.stderr
    tested = _promtool("test", "rules", str(CASES))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_a_broken_threshold_or_hold_time_fails_the_python_rule_tests(tmp_path):
    mutants = _mutants()
    assert len(mutants) == len(_rules()) + sum(1 for rule in _rules() if rule.get("for"))
    for alert, change, rules in mutants:
        failures = run_rule_tests(_write_mutant(tmp_path, rules))
        assert failures, f"{alert} with {change} still passes"
        assert all(f": {alert} at " in failure for failure in failures), failures


@needs_promtool
def test_a_broken_threshold_or_hold_time_fails_promtools_rule_tests(tmp_path):
    for alert, change, rules in _mutants():
        tested = _promtool("test", "rules", str(_write_mutant(tmp_path, rules)))
        assert tested.returncode == 1, f"{alert} with {change} still passes"
        assert f"alertname: {alert}," in tested.stdout + tested.stderr


def test_the_prometheus_configuration_scrapes_the_broker_and_loads_the_rules():
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    (job,) = config["scrape_configs"]
    assert (job["metrics_path"], job["honor_labels"], job["authorization"]["type"]) == ("/metrics", True, "Bearer")


def test_the_operations_guide_explains_every_alert():
    guide = OPERATIONS.read_text()
    assert "\n## Alerts\n" in guide
    for rule in _rules():
        assert f"`{rule['alert']}`" in guide, rule["alert"]


@pytest.mark.django_db
def test_the_rules_name_only_metrics_the_broker_exports_or_that_are_pending(client):
    with transaction.atomic():
        ledger_append(kind="test.event", subject="thing:1", payload={})
    ledger_checkpoint_and_anchor()  # the anchor's age is exported once there is one
    scrape = client.get("/metrics").content.decode()
    exported = set()
    for family in text_string_to_metric_families(scrape):
        exported |= {sample.name for sample in family.samples} | {family.name}
    named = {name for rule in _rules() for name in _METRIC.findall(rule["expr"])}
    assert named - exported - set(PENDING_METRICS) == set()
    assert "broker_orders_degraded" in named & exported
