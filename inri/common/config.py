"""One validator for every INRI configuration: relay TOML, bootstrap TOML and scenario files.

Each configuration is a tree of frozen dataclasses; a field's type annotation is its rule, ranges
included (`Annotated[int, msgspec.Meta(ge=1)]`), and msgspec checks values against it (a maintained
library rather than three hand-written coercers that disagreed: the bootstrap used to turn 16.9 into
16, the relay accepted a negative route_k). Every refusal names where the value came from: the file
and key (`relay.toml [engine] route_k`) or the environment variable (`INRI_ENGINE_ROUTE_K`).

Values from TOML must have the declared type (an int is accepted for a float, nothing else is
converted). Values from the environment are text and are parsed: numbers, booleans (true/false,
yes/no, 1/0) and comma-separated lists.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec

from inri.core.config import EngineConfig
from inri.protocol import limits


class ConfigError(ValueError):
    """A configuration problem, naming the file and key or the environment variable at fault."""


T = TypeVar("T")

_POS = msgspec.Meta(gt=0)
_NONNEG = msgspec.Meta(ge=0)
_ONE_UP = msgspec.Meta(ge=1)

# The engine's ranges (inri.core stays free of validation code): counts and sizes are >= 1 or >= 0,
# every interval is > 0; scores are signed by design and have no range here.
ENGINE_RULES: dict[str, msgspec.Meta] = {
    **{name: _ONE_UP for name in (
        "active_min", "active_max", "passive_max", "keepalive_misses", "gossip_ttl", "route_k", "route_max",
        "reg_budget_burst", "reg_budget_peer_burst", "push_ttl", "reverse_max", "custody_max",
        "custody_max_attempts", "push_seen_max", "push_budget_peer_burst")},
    **{name: _NONNEG for name in ("outbound_min", "priority_join_below", "far_links", "forward_jitter_s",
                                   "tree_announce_delay_s", "fallback_budget")},
    # The flood's hops start at 2 + U{0..noise} and must stay one-byte (< 128) over a mesh's longest
    # flood path (about 45 hops on a sparse geographic mesh of 5k relays): docs/operations.md.
    "stem_hop_noise": msgspec.Meta(ge=0, le=64),
    "stem_fluff_probability": msgspec.Meta(gt=0, le=1),
    **{name: msgspec.Meta(ge=0, le=1) for name in ("tree_eager_share", "tree_explore")},
    **{name: _POS for name in (
        "keepalive_interval_s", "peer_exchange_interval_s", "connect_timeout_s", "seen_ttl_s",
        "reg_budget_per_origin_per_s", "reg_budget_per_peer_per_s", "reverse_ttl_s", "custody_retry_s",
        "custody_deadline_s", "custody_max_ttl_s", "custody_park_max_s", "push_budget_per_peer_per_s",
        "score_half_life_s", "score_ban_s",
        "receipt_timeout_s", "stem_epoch_s", "stem_embargo_s", "tree_graft_timeout_s")},
}


@dataclass(frozen=True)
class Setting:
    """One configured value and where it came from.

    origin: what an error about the value names ("relay.toml: engine.route_k", "INRI_ENGINE_ROUTE_K").
    text: the value is text to parse (environment variables), not a typed TOML value.
    source: what an unknown-key error names (the file); empty: the origin.
    """

    value: Any
    origin: str
    text: bool = False
    source: str = ""


def read_toml(path: str | Path, error: type[ValueError] = ConfigError) -> dict[str, Any]:
    """A TOML file as a dict; `error` (a ValueError subclass) names the file when it is missing or invalid."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise error(f"{path}: not valid TOML: {str(exc)[:200]}") from None


def _strip_annotated(hint: Any) -> Any:
    return typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint


def _from_text(text: str, hint: Any) -> Any:
    """Environment text -> the shape msgspec's lax mode parses (it already reads numbers and true/false/1/0)."""
    base = _strip_annotated(hint)
    if base is bool and text.strip().lower() in ("yes", "no"):
        return text.strip().lower() == "yes"
    if typing.get_origin(base) is tuple:
        return [part.strip() for part in text.split(",") if part.strip()]
    return text


def _floats_finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, tuple):
        return all(_floats_finite(v) for v in value)
    return True


def check_value(
    value: Any, hint: Any, origin: str, *, text: bool = False, error: type[ValueError] = ConfigError
) -> Any:
    """One value checked (and, for text, parsed) against a type hint; `error` naming origin otherwise."""
    raw = _from_text(value, hint) if text and isinstance(value, str) else value
    try:
        out = msgspec.convert(raw, hint, strict=not text)
    except msgspec.ValidationError as exc:
        expected = str(exc).split(", got `")[0].replace("`", "")  # we name the value itself instead
        raise error(f"{origin}: {expected}, got {value!r:.80}") from None
    if not _floats_finite(out):
        raise error(f"{origin}: expected a finite number, got {value!r:.80}")
    return out


def field_hints(cls: type, rules: Mapping[str, msgspec.Meta] | None = None) -> dict[str, Any]:
    """Field name -> type hint of a dataclass, with `rules` added as msgspec constraints."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if rules and f.name in rules:
            hint = Annotated[hint, rules[f.name]]
        out[f.name] = hint
    return out


def apply(
    section: T,
    settings: Mapping[str, Setting],
    *,
    where: str,
    rules: Mapping[str, msgspec.Meta] | None = None,
    error: type[ValueError] = ConfigError,
) -> T:
    """`section` (a dataclass instance) with `settings` applied, each checked against its field's type.

    where: names the section in the message for an unknown key ("relay.toml [api]").
    """
    hints = field_hints(type(section), rules)
    changes = {}
    for key, s in settings.items():
        if key not in hints:
            raise error(f"{s.source or s.origin}: unknown key {key!r} in {where} (known: {', '.join(sorted(hints))})")
        changes[key] = check_value(s.value, hints[key], s.origin, text=s.text, error=error)
    return dataclasses.replace(section, **changes)  # type: ignore[type-var]


def build(
    cls: type[T],
    table: Any,
    *,
    where: str,
    rules: Mapping[str, msgspec.Meta] | None = None,
    error: type[ValueError] = ConfigError,
) -> T:
    """A dataclass from one TOML table (its required fields must be present), each value checked."""
    if not isinstance(table, dict):
        raise error(f"{where} must be a table")
    hints = field_hints(cls, rules)
    values = {}
    for key, value in table.items():
        if key not in hints:
            raise error(f"{where}: unknown key {key!r} (known: {', '.join(sorted(hints))})")
        values[key] = check_value(value, hints[key], f"{where} {key}", error=error)
    missing = [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
               if f.name not in values and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise error(f"{where}: missing key {missing[0]!r}")
    return cls(**values)


def engine_config(base: EngineConfig, settings: Mapping[str, Setting], *, where: str,
                  error: type[ValueError] = ConfigError) -> EngineConfig:
    """EngineConfig with settings applied under ENGINE_RULES, plus the rules that tie fields together."""
    cfg = apply(base, settings, where=where, rules=ENGINE_RULES, error=error)

    def origin(key: str) -> str:
        s = settings.get(key)
        return s.origin if s is not None else f"{where} {key}"

    if cfg.active_min > cfg.active_max:
        raise error(f"{origin('active_min')}: must be <= active_max ({cfg.active_max})")
    if cfg.outbound_min > cfg.active_max:
        raise error(f"{origin('outbound_min')}: must be <= active_max ({cfg.active_max})")
    if cfg.far_links > cfg.active_min:
        raise error(f"{origin('far_links')}: must be <= active_min ({cfg.active_min})")
    for key in ("gossip_ttl", "push_ttl"):  # the wire field's maximum: the encoder refuses more
        if getattr(cfg, key) > limits.MAX_TTL:
            raise error(f"{origin(key)}: {getattr(cfg, key)} is above the wire maximum {limits.MAX_TTL} "
                        "(inri/protocol/limits.py MAX_TTL)")
    return cfg
