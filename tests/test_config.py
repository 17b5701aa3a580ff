"""One validator for relay, bootstrap and scenario files (inri.common.config): types, ranges, unknown keys."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap_nodes.config import load_bootstrap_config
from inri.common.config import ConfigError
from inri.node.config import load_config
from simulations.scenario import ScenarioError, from_dict


def _relay(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> None:
    f = tmp_path / "relay.toml"
    f.write_text(text)
    load_config(f, env=env or {})


def _bootstrap(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> None:
    f = tmp_path / "bootstrap.toml"
    f.write_text(text)
    load_bootstrap_config(f, env=env or {})


def _scenario(**tables: dict[str, object]) -> None:
    base: dict[str, object] = {"name": "t", "topology": {"relays": 10}, "workload": {"registrations": 1, "pushes": 1}}
    base.update(tables)
    from_dict(base)


@pytest.mark.parametrize("key", ["route_k", "custody_max_attempts", "gossip_ttl", "keepalive_misses"])
def test_negative_engine_counts_are_refused_by_relay_and_scenario(tmp_path: Path, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"relay\.toml: engine\.{key}: Expected int >= 1, got -1"):
        _relay(tmp_path, f"[engine]\n{key} = -1\n")
    with pytest.raises(ScenarioError, match=rf"\[engine\] {key}: Expected int >= 1"):
        _scenario(engine={key: -1})


def test_bootstrap_refuses_a_fraction_for_an_integer(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"bootstrap\.per_prefix_max: Expected int, got 16\.9"):
        _bootstrap(tmp_path, "[bootstrap]\nper_prefix_max = 16.9\n")
    with pytest.raises(ConfigError, match="INRI_BOOTSTRAP_MAX_RECORDS: Expected int, got '16.9'"):
        load_bootstrap_config(None, env={"INRI_BOOTSTRAP_MAX_RECORDS": "16.9"})


def test_same_rules_for_the_same_mistakes_everywhere(tmp_path: Path) -> None:
    # A string where a number belongs, a negative rate, a non-finite number, an unknown key: the three
    # readers refuse each one and name the key.
    for text, where in (('[api]\nrate_per_s = "fast"\n', r"api\.rate_per_s: Expected float, got 'fast'"),
                        ("[api]\nrate_per_s = -1\n", r"api\.rate_per_s: Expected float > 0"),
                        ("[quic]\nidle_timeout_s = nan\n", r"quic\.idle_timeout_s"),
                        ("[relay]\nannounce_interval_s = inf\n", r"relay\.announce_interval_s: expected a finite"),
                        ("[api]\ncolour = 1\n", r"relay\.toml: unknown key 'colour' in \[api\]")):
        with pytest.raises(ConfigError, match=where):
            _relay(tmp_path, text)
    for text, where in (('[bootstrap]\nrate_per_s = "fast"\n', r"bootstrap\.rate_per_s: Expected float, got 'fast'"),
                        ("[bootstrap]\nrate_per_s = -1\n", r"bootstrap\.rate_per_s: Expected float > 0"),
                        ("[bootstrap]\nsync_interval_s = inf\n", "sync_interval_s: expected a finite"),
                        ("[bootstrap]\ncolour = 1\n", r"bootstrap\.toml: unknown key 'colour' in \[bootstrap\]")):
        with pytest.raises(ConfigError, match=where):
            _bootstrap(tmp_path, text)
    for tables, where in (({"topology": {"relays": "many"}}, r"\[topology\] relays: Expected int, got 'many'"),
                          ({"topology": {"relays": 10.5}}, r"\[topology\] relays: Expected int"),
                          ({"churn": {"downtime_s": -1.0}}, r"\[churn\] downtime_s: Expected float >= 0"),
                          ({"workload": {"colour": 1}}, r"\[workload\]: unknown key 'colour'")):
        with pytest.raises(ScenarioError, match=where):
            _scenario(**tables)


def test_environment_errors_name_the_variable_not_defaults() -> None:
    for env, name in (({"INRI_ENGINE_ROUTE_K": "-2"}, "INRI_ENGINE_ROUTE_K: Expected int >= 1"),
                      ({"INRI_API_RATE_PER_S": "fast"}, "INRI_API_RATE_PER_S: Expected float"),
                      ({"INRI_RELAY_API": "nope"}, "INRI_RELAY_API: address 'nope' is not host:port"),
                      ({"INRI_TRACE_COLOUR": "red"}, "INRI_TRACE_COLOUR: unknown key 'colour'")):
        with pytest.raises(ConfigError, match=name) as err:
            load_config(None, env=env)
        assert "defaults" not in str(err.value)
    with pytest.raises(ConfigError, match="INRI_BOOTSTRAP_RATE_BURST: Expected int >= 1"):
        load_bootstrap_config(None, env={"INRI_BOOTSTRAP_RATE_BURST": "0"})
    # Text from the environment is parsed as before: numbers, yes/no, comma-separated lists.
    cfg = load_config(None, env={"INRI_ENGINE_ROUTE_K": "3", "INRI_RELAY_BOOTSTRAP": "http://a, http://b",
                                 "INRI_API_TARPIT_S": "0.5"})
    assert (cfg.engine.route_k, cfg.relay.bootstrap, cfg.api.tarpit_s) == (3, ("http://a", "http://b"), 0.5)
    assert load_bootstrap_config(None, env={"INRI_BOOTSTRAP_ALLOW_PRIVATE": "yes"}).allow_private


@pytest.mark.integration
def test_check_config_names_the_key_and_exits_2(tmp_path: Path) -> None:
    f = tmp_path / "relay.toml"
    f.write_text("[engine]\ncustody_max_attempts = -3\n")
    proc = subprocess.run([sys.executable, "-m", "inri.cli", "relay", "--config", str(f), "--check-config"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "engine.custody_max_attempts: Expected int >= 1, got -3" in proc.stderr
    f.write_text("[engine]\ncustody_max_attempts = 3\n")
    proc = subprocess.run([sys.executable, "-m", "inri.cli", "relay", "--config", str(f), "--check-config"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and '"custody_max_attempts": 3' in proc.stdout
    assert '"route_table": "compact"' in proc.stdout  # the relay's default table (issue 18)


def test_relays_default_to_the_compact_route_table_and_scenarios_to_the_dict() -> None:
    """A relay holds its routes in the compact table (about 60 B a route) unless its config says
    otherwise; a scenario runs on the dict table (its engines share route id objects) unless it sets
    `route_table`."""
    assert load_config(None, env={}).engine.route_table == "compact"
    assert load_config(None, env={"INRI_ENGINE_ROUTE_TABLE": "dict"}).engine.route_table == "dict"
    base: dict[str, object] = {"name": "t", "topology": {"relays": 10}, "workload": {"registrations": 1, "pushes": 1}}
    assert from_dict(dict(base)).engine.route_table == "dict"
    assert from_dict({**base, "engine": {"route_table": "compact"}}).engine.route_table == "compact"
