"""Owners of the engine's state (issue 38, docs/architecture.md "Owners of state"): every attribute of the
engine has one owner, checked over the source (AST), so a rule group cannot quietly start reading or
writing another group's tables.

Three kinds of engine attribute:
- OWNER_OBJECTS: an object that owns its data behind methods (aioquic's pattern: its connection holds
  its loss recovery as `self._loss`). Any rule group may call it; nothing outside its class touches its
  fields (`__slots__`).
- OWNED: an attribute read and written only in one module (its rule group), apart from Engine.__init__,
  which builds every attribute. Other groups ask that module's methods.
- SHARED: still read or written by several modules. This list only shrinks: an attribute moved to an
  owner leaves it, and a new attribute must be given an owner.
"""

from __future__ import annotations

import ast
from pathlib import Path

from inri.core.awaited import AwaitedAnswers
from inri.core.roundtrip import RttEstimator
from inri.core.seen import SeenCache
from inri.core.stemstate import StemState
from inri.core.tree import TreeGossip

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "inri" / "core"

# engine attribute -> the class that owns it (its fields are private to the class)
OWNER_OBJECTS: dict[str, type] = {"_rtt": RttEstimator, "_seen": SeenCache, "_tree": TreeGossip,
                                   "_await": AwaitedAnswers, "_stem": StemState}

# engine attribute -> the only module (inri/core/<name>.py) whose code reads or writes it
OWNED: dict[str, str] = {
    # membership.py (M1-M7)
    "listen_addr": "membership", "_near": "membership", "_far": "membership", "_next_make_room": "membership",
    "_next_rejoin": "membership", "_started_at": "membership", "_full_until": "membership",
    "_rejoined": "membership",
    # gossip.py (G1-G5, G9's switch)
    "_emit_row": "gossip", "_tree_on": "gossip",
    # stem.py (G6-G8, G10)
    "_stem_key": "stem", "_repair_asked": "stem", "_restem_due": "stem", "_repair_due": "stem",
    # sync.py (G11)
    "_sync_keys": "sync",
    # forwarding.py (F1-F10)
    "_hole_suspects": "forwarding", "_receipt_hold": "forwarding", "_repair_heap": "forwarding",
    "_steer": "forwarding", "_finds": "forwarding", "_kept_from": "forwarding",
    # custody.py (C1-C3, C7)
    "_waiting_route": "custody", "_renewed_at": "custody",
    # scoring.py (S1, S2)
    "_overdue": "scoring", "_overdue_heap": "scoring", "_blamed": "scoring",
    # engine.py (dispatch, timers: M2's keepalives, S1's decay)
    "_score_decay": "engine", "_tracer": "engine",
    # state.py (the trace helper every group calls)
    "_emit": "state",
}

# Still read or written by several modules: the work left (docs/architecture.md says which groups).
SHARED = frozenset({
    "relay_id", "config", "wall_offset", "counters", "reg_duplicates", "_verifier", "_home", "_level", "_rng",
    "_active", "_passive", "_connecting", "_lost", "_routes", "_origin_bucket", "_reverse", "_custody", "_timers",
    "_seq", "_next_tick", "_next_sweep", "_next_exchange", "_banned", "_probation", "_heard_any", "_homed", "_deep",
    "_announce", "_down_since", "_sync_until", "_sync_asked", "_sync_served", "_sync_out", "_provisional",
})


def engine_attributes() -> set[str]:
    """The data attributes Engine.__init__ sets on self."""
    tree = ast.parse((CORE / "engine.py").read_text())
    init = next(f for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name == "Engine"
                for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    return {t.attr for n in ast.walk(init) if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}


def _init_nodes(tree: ast.Module) -> set[int]:
    """ids of the nodes inside Engine.__init__ (where every attribute is built)."""
    return {id(n) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name == "Engine"
            for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__" for n in ast.walk(f)}


def cross_owner_accesses(module: str, source: str) -> list[str]:
    """Accesses in `source` (inri/core/<module>.py) to an OWNED engine attribute of another module, or to a
    field of an owner object from outside its class: "module:line attribute"."""
    tree = ast.parse(source)
    skip = _init_nodes(tree)
    owners = {cls.__name__ for cls in OWNER_OBJECTS.values()}
    # inside an owner object's class, self is that object, not the engine
    in_owner = {id(n) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name in owners for n in ast.walk(c)}
    private = {f: cls for cls in OWNER_OBJECTS.values() for f in cls.__slots__}
    found = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Attribute) or id(n) in skip:
            continue
        on_self = isinstance(n.value, ast.Name) and n.value.id == "self"
        owner = OWNED.get(n.attr)
        if owner is not None and on_self and owner != module and id(n) not in in_owner:
            found.append(f"{module}:{n.lineno} {n.attr} (owned by {owner}.py)")
        cls = private.get(n.attr)
        if cls is not None and not on_self:  # an owner's own methods reach its fields through self only
            found.append(f"{module}:{n.lineno} {n.attr} (a field of {cls.__name__})")
    return sorted(set(found))


def test_every_engine_attribute_has_an_owner_or_is_listed_shared() -> None:
    attrs = engine_attributes()
    kinds = [set(OWNER_OBJECTS), set(OWNED), set(SHARED)]
    assert not (kinds[0] & kinds[1]) and not (kinds[0] & kinds[2]) and not (kinds[1] & kinds[2])
    unclassified = attrs - set().union(*kinds)
    assert not unclassified, f"give these engine attributes an owner (tests/test_core_owners.py): {unclassified}"
    gone = set().union(*kinds) - attrs
    assert not gone, f"no longer engine attributes: remove them from tests/test_core_owners.py: {gone}"


def test_no_rule_group_touches_another_owners_state() -> None:
    found = []
    for path in sorted(CORE.glob("*.py")):
        found += cross_owner_accesses(path.stem, path.read_text())
    assert not found, "cross-owner accesses (use the owner's methods):\n" + "\n".join(found)


def test_owner_fields_are_private_outside_the_core_too() -> None:
    """Tests, the simulator and benchmarks use owner objects through their methods as well."""
    private = {f: cls for cls in OWNER_OBJECTS.values() for f in cls.__slots__}
    found = []
    for folder in ("simulations", "benchmarks", "tests", "inri/node"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for n in ast.walk(ast.parse(path.read_text())):
                if (isinstance(n, ast.Attribute) and n.attr in private and isinstance(n.value, ast.Attribute)
                        and n.value.attr in OWNER_OBJECTS):
                    found.append(f"{path.relative_to(ROOT)}:{n.lineno} {n.value.attr}.{n.attr}")
    assert not found, found


def test_the_check_sees_a_cross_owner_access() -> None:
    """The checker itself: a rule group reading another group's table, or an owner object's field, is found."""
    forwarding = ("class F:\n    def f(self):\n"
                  "        return self._steer, self._blamed, self._rtt._srtt, self._tree._missing\n")
    assert cross_owner_accesses("forwarding", forwarding) == [
        "forwarding:3 _blamed (owned by scoring.py)", "forwarding:3 _missing (a field of TreeGossip)",
        "forwarding:3 _srtt (a field of RttEstimator)"]
    init = "class Engine:\n    def __init__(self):\n        self._blamed = {}\n"
    assert cross_owner_accesses("engine", init) == []


def test_owner_objects_have_slots_only() -> None:
    """An owner object's state is its __slots__ (no __dict__ to grow an attribute elsewhere)."""
    for cls in OWNER_OBJECTS.values():
        assert "__dict__" not in dir(cls), cls
        assert all(f.startswith("_") for f in cls.__slots__), cls


def test_shared_declarations_only_in_engine_state() -> None:
    """EngineState (state.py) declares what is still shared; an owned attribute is declared by its owner's
    rule-group class, so reading that module shows the state it owns."""
    tree = ast.parse((CORE / "state.py").read_text())
    declared = {b.target.id for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name == "EngineState"
                for b in c.body if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name)}
    misplaced = {a for a in declared if OWNED.get(a, "state") != "state"}
    assert not misplaced, f"declare these in their owner's module: {misplaced}"
