"""Owners of the engine's state (issue 38, docs/architecture.md "Owners of state"): every attribute of the
engine has one owner, checked over the source (AST), so a rule group cannot quietly start reading or
writing another group's tables.

Four kinds of engine attribute:
- OWNER_OBJECTS: an object that owns its data behind methods (aioquic's pattern: its connection holds
  its loss recovery as `self._loss`). Any rule group may call it; nothing outside its class touches its
  fields (`__slots__`).
- OWNED: an attribute read and written only in one module (its rule group), apart from Engine.__init__,
  which builds every attribute. Other groups ask that module's methods.
- CONTEXT: what the engine is given when it is built (its identity, configuration, verifier, home store,
  random stream, trace level) or by its driver between calls (`wall_offset`): every rule group reads it,
  none rebinds it (checked below); the objects among them have interfaces of their own. `_linked` is the
  read-only view of the linked neighbours that their owner, Neighbours, hands out (typed Mapping).
- SHARED: still read or written by several modules. This list only shrinks: an attribute moved to an
  owner leaves it, and a new attribute must be given an owner.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

from inri.core.awaited import AwaitedAnswers
from inri.core.engine import Engine
from inri.core.floodstate import FloodState
from inri.core.homed import HomedRoutes
from inri.core.kept import CustodyTable
from inri.core.neighbours import Neighbours
from inri.core.reverse import ReversePaths
from inri.core.roundtrip import RttEstimator
from inri.core.seen import SeenCache
from inri.core.stemstate import StemState
from inri.core.syncstate import SyncState
from inri.core.tables import CompactRouteTable, RouteTable
from inri.core.tree import TreeGossip
from inri.core.withdrawals import Withdrawals

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "inri" / "core"

# engine attribute -> the class that owns it (its fields are private to the class), or the classes, one of
# which it is (the route table: `[engine] route_table` chooses the dict or the compact one)
OWNER_OBJECTS: dict[str, type | tuple[type, ...]] = {
    "_rtt": RttEstimator, "_seen": SeenCache, "_tree": TreeGossip, "_await": AwaitedAnswers, "_stem": StemState,
    "_routes": (RouteTable, CompactRouteTable), "_custody": CustodyTable, "_reverse": ReversePaths,
    "_homed": HomedRoutes, "_flood": FloodState, "_sync": SyncState,
    "_neighbours": Neighbours, "_withdrawals": Withdrawals}


def owner_classes() -> list[type]:
    """Every class of OWNER_OBJECTS."""
    return [c for v in OWNER_OBJECTS.values() for c in (v if isinstance(v, tuple) else (v,))]


def private_fields() -> dict[str, str]:
    """Owner objects' fields -> the classes that have one of that name ("A or B")."""
    names: dict[str, set[str]] = {}
    for cls in owner_classes():
        for f in cls.__slots__:
            names.setdefault(f, set()).add(cls.__name__)
    return {f: " or ".join(sorted(c)) for f, c in names.items()}

# engine attribute -> the only module (inri/core/<name>.py) whose code reads or writes it
OWNED: dict[str, str] = {
    # membership.py (M1-M7)
    "listen_addr": "membership", "_near": "membership", "_far": "membership", "_next_make_room": "membership",
    "_next_rejoin": "membership", "_started_at": "membership", "_full_until": "membership",
    "_rejoined": "membership", "_next_tick": "membership", "_next_exchange": "membership",
    # gossip.py (G1-G5, G9's switch)
    "_emit_row": "gossip", "_tree_on": "gossip",
    # stem.py (G6-G8, G10)
    "_stem_key": "stem", "_repair_asked": "stem", "_restem_due": "stem", "_repair_due": "stem",
    # forwarding.py (F1-F10)
    "_hole_suspects": "forwarding", "_receipt_hold": "forwarding", "_repair_heap": "forwarding",
    "_steer": "forwarding", "_finds": "forwarding", "_kept_from": "forwarding",
    # custody.py (C1-C3, C7)
    "_waiting_route": "custody", "_renewed_at": "custody",
    # scoring.py (S1, S2)
    "_overdue": "scoring", "_overdue_heap": "scoring", "_blamed": "scoring",
    # engine.py (dispatch, timers: M2's keepalives, S1's decay)
    "_score_decay": "engine", "_tracer": "engine", "_next_sweep": "engine",
    # state.py (the trace and count helpers every group calls)
    "_emit": "state", "counters": "state",
    # gossip.py (G3's duplicate count)
    "reg_duplicates": "gossip",
}

# Given at construction (or by the driver: wall_offset) and never rebound by a rule group.
CONTEXT = frozenset({"relay_id", "config", "wall_offset", "_verifier", "_home", "_level", "_rng", "_linked"})

# Still read or written by several modules: none left. It stays empty: a new attribute is given an owner.
SHARED: frozenset[str] = frozenset()


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


# The classes Engine is built from: `self` in their methods is the engine (elsewhere in inri/core, for example
# in tables.py's RouteTable, `self._seq` is that object's own field).
RULE_GROUPS = frozenset(c.__name__ for c in Engine.__mro__)


def _outside_rule_groups(tree: ast.Module) -> set[int]:
    """ids of the nodes inside a class that is not one of Engine's rule groups."""
    return {id(n) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name not in RULE_GROUPS
            for n in ast.walk(c)}


def cross_owner_accesses(module: str, source: str) -> list[str]:
    """Accesses in `source` (inri/core/<module>.py) to an OWNED engine attribute of another module, or to a
    field of an owner object from outside its class: "module:line attribute"."""
    tree = ast.parse(source)
    skip = _init_nodes(tree)
    elsewhere = _outside_rule_groups(tree)
    owners = {cls.__name__ for cls in owner_classes()}
    # inside an owner object's class, self is that object, not the engine
    in_owner = {id(n) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name in owners for n in ast.walk(c)}
    private = private_fields()
    found = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Attribute) or id(n) in skip:
            continue
        on_self = isinstance(n.value, ast.Name) and n.value.id == "self"
        owner = OWNED.get(n.attr)
        if owner is not None and on_self and owner != module and id(n) not in in_owner and id(n) not in elsewhere:
            found.append(f"{module}:{n.lineno} {n.attr} (owned by {owner}.py)")
        cls = private.get(n.attr)
        if cls is not None and not on_self:  # an owner's own methods reach its fields through self only
            found.append(f"{module}:{n.lineno} {n.attr} (a field of {cls})")
    return sorted(set(found))


def test_every_engine_attribute_has_an_owner_or_is_listed_shared() -> None:
    attrs = engine_attributes()
    kinds = [set(OWNER_OBJECTS), set(OWNED), set(CONTEXT), set(SHARED)]
    assert all(not (a & b) for i, a in enumerate(kinds) for b in kinds[i + 1:]), "an attribute of two kinds"
    unclassified = attrs - set().union(*kinds)
    assert not unclassified, f"give these engine attributes an owner (tests/test_core_owners.py): {unclassified}"
    gone = set().union(*kinds) - attrs
    assert not gone, f"no longer engine attributes: remove them from tests/test_core_owners.py: {gone}"


def context_rebindings(module: str, source: str) -> list[str]:
    """Assignments in a rule group of `source` (outside Engine.__init__) to a CONTEXT attribute of the engine."""
    tree = ast.parse(source)
    skip = _init_nodes(tree) | _outside_rule_groups(tree)
    found = []
    for n in ast.walk(tree):
        match n:
            case ast.Assign(targets=targets):
                pass
            case ast.AugAssign(target=t) | ast.AnnAssign(target=t):
                targets = [t]
            case ast.Delete(targets=targets):
                pass
            case _:
                continue
        # self.x = ..., self.x[k] = ..., self.x.f = ...: x itself is rebound or changed (a record reached
        # through it, as self._linked[peer].last_sent, is that record's business)
        while any(isinstance(t, ast.Tuple | ast.List | ast.Starred) for t in targets):
            targets = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple | ast.List) else
                                                   [t.value] if isinstance(t, ast.Starred) else [t])]
        for t in targets:
            a = t.value if isinstance(t, ast.Subscript | ast.Attribute) and isinstance(t.value, ast.Attribute) else t
            if (isinstance(a, ast.Attribute) and a.attr in CONTEXT and isinstance(a.value, ast.Name)
                    and a.value.id == "self" and id(a) not in skip):
                found.append(f"{module}:{a.lineno} {a.attr}")
    return sorted(set(found))


def over_core(check: Callable[[str, str], list[str]]) -> list[str]:
    """check(module, source) over every module of inri/core."""
    return [f for path in sorted(CORE.glob("*.py")) for f in check(path.stem, path.read_text())]


def test_no_rule_group_rebinds_the_engines_context() -> None:
    found = over_core(context_rebindings)
    assert not found, "the engine's context is set at construction only:\n" + "\n".join(found)


def test_the_context_check_sees_a_rebinding() -> None:
    source = ("class ForwardingRules:\n    def f(self):\n        self.config = None\n        self.wall_offset += 1\n"
              "        self._linked['a'] = 1\n        self.config.x, y = 2, 3\n"
              "        self._linked['a'].last_sent = 3\n"
              "class Other:\n    def g(self):\n        self.config = None\n")
    assert context_rebindings("forwarding", source) == [
        "forwarding:3 config", "forwarding:4 wall_offset", "forwarding:5 _linked", "forwarding:6 config"]


def test_no_rule_group_touches_another_owners_state() -> None:
    found = over_core(cross_owner_accesses)
    assert not found, "cross-owner accesses (use the owner's methods):\n" + "\n".join(found)


def test_owner_fields_are_private_outside_the_core_too() -> None:
    """Tests, the simulator and benchmarks use owner objects through their methods as well."""
    private = private_fields()
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
    forwarding = ("class ForwardingRules:\n    def f(self):\n"
                  "        return self._steer, self._blamed, self._rtt._srtt, self._tree._missing\n"
                  "    def g(self):\n"
                  "        return self._routes._expire_from, self._routes._peer_ix, self._routes.get(b'')\n")
    assert cross_owner_accesses("forwarding", forwarding) == [
        "forwarding:3 _blamed (owned by scoring.py)", "forwarding:3 _missing (a field of TreeGossip)",
        "forwarding:3 _srtt (a field of RttEstimator)",
        "forwarding:5 _expire_from (a field of CompactRouteTable or RouteTable)",
        "forwarding:5 _peer_ix (a field of CompactRouteTable)"]
    init = "class Engine:\n    def __init__(self):\n        self._blamed = {}\n"
    assert cross_owner_accesses("engine", init) == []
    # a class that is not a rule group has fields of its own
    assert cross_owner_accesses("tables", "class RouteTable:\n    def f(self):\n        return self._steer\n") == []


def test_owner_objects_have_slots_only() -> None:
    """An owner object's state is its __slots__ (no __dict__ to grow an attribute elsewhere)."""
    for cls in owner_classes():
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


def cross_group_stubs() -> dict[str, set[str]]:
    """state.py's type-checker declarations of calls between rule groups -> the modules (neither the one
    that defines the method, nor engine.py, which inherits every group) that call it."""
    state = next(c for c in ast.walk(ast.parse((CORE / "state.py").read_text()))
                 if isinstance(c, ast.ClassDef) and c.name == "EngineState")
    stubs = {f.name for b in state.body if isinstance(b, ast.If) and isinstance(b.test, ast.Name)
             and b.test.id == "TYPE_CHECKING" for f in b.body if isinstance(f, ast.FunctionDef)}
    defined: dict[str, set[str]] = {}
    called: dict[str, set[str]] = {}
    for path in CORE.glob("*.py"):
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.FunctionDef) and path.stem != "state":
                defined.setdefault(n.name, set()).add(path.stem)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
                called.setdefault(n.attr, set()).add(path.stem)
    assert stubs, "no stubs found: has EngineState's TYPE_CHECKING block moved?"
    return {s: called.get(s, set()) - defined.get(s, set()) - {"engine", "state"} for s in stubs}


def test_every_stub_declares_a_call_between_rule_groups() -> None:
    """A stub whose method only its own group or the engine calls is dead weight: the list shrinks as rules
    move into owners, and never keeps a declaration nothing needs."""
    unneeded = sorted(s for s, callers in cross_group_stubs().items() if not callers)
    assert not unneeded, f"remove these stubs from state.py (no other rule group calls them): {unneeded}"
