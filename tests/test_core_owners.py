"""Owners of the engine's state (issue 38, docs/architecture.md "Owners of state"): every attribute of the
engine and of its rule groups has one owner, checked over the source (AST), so a rule group cannot quietly
start reading or writing another group's tables.

The engine (engine.py) builds eight rule groups (membership.py ... rtt.py), each an object of its own class
(RULE_GROUPS), and wires them to the groups they call (GROUP_REFS). Kinds of attribute:
- OWNER_OBJECTS: an object that owns its data behind methods (aioquic's pattern: its connection holds
  its loss recovery as `self._loss`), built once by Engine.__init__ and handed to the groups that use it.
  Nothing outside its class touches its fields (`__slots__`).
- OWNED: an attribute of one rule group (or of the engine), built by that class's __init__ and read and
  written only through `self` inside that class. Other groups call its methods: a reference to another
  group (GROUP_REFS) is used for method calls only.
- CONTEXT: what the engine is given when it is built (its identity, configuration, verifier, home store,
  random stream, trace level and sink, counters) or by its driver between calls (`wall_offset`, held in
  the shared EngineContext `_ctx`): every rule group reads it, none rebinds it (checked below). `_linked`
  is the read-only view of the linked neighbours that their owner, Neighbours, hands out (typed Mapping).
- SHARED: still read or written by several groups. It stays empty: a new attribute is given an owner.
No method stubs: a call between groups is a call on a typed reference to the other group, so nothing in
inri/core declares another group's methods for the type checker (checked below).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

from inri.core.awaited import AwaitedAnswers
from inri.core.backups import BackupCopies
from inri.core.engine import HOOKS
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
    "_neighbours": Neighbours, "_withdrawals": Withdrawals, "_backups": BackupCopies}


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
    "_near": "membership", "_far": "membership", "_next_make_room": "membership",
    "_next_rejoin": "membership", "_started_at": "membership", "_full_until": "membership",
    "_rejoined": "membership", "_next_tick": "membership", "_next_exchange": "membership",
    # gossip.py (G1-G5, G9's switch)
    "_emit_row": "gossip", "_tree_on": "gossip",
    # stem.py (G6-G8, G10)
    "_stem_key": "stem", "_repair_asked": "stem", "_restem_due": "stem", "_repair_due": "stem", "_regen_budget": "stem",
    # forwarding.py (F1-F10)
    "_hole_suspects": "forwarding", "_receipt_hold": "forwarding", "_repair_heap": "forwarding",
    "_steer": "forwarding", "_finds": "forwarding", "_kept_from": "forwarding",
    # custody.py (C1-C3, C7)
    "_waiting_route": "custody", "_renewed_at": "custody",
    # scoring.py (S1, S2)
    "_overdue": "scoring", "_overdue_heap": "scoring", "_blamed": "scoring",
    # engine.py (dispatch, timers: M2's keepalives, S1's decay)
    "_score_decay": "engine", "_tracer": "engine", "_next_sweep": "engine",
    # gossip.py (G3's duplicate count)
    "reg_duplicates": "gossip",
}

# Given at construction (or by the driver: wall_offset, through _ctx) and never rebound by a rule group.
CONTEXT = frozenset({"relay_id", "config", "listen_addr", "_ctx", "_verifier", "_home", "_level", "_rng", "_emit",
                     "counters", "_linked"})

# Still read or written by several modules: none left. It stays empty: a new attribute is given an owner.
SHARED: frozenset[str] = frozenset()

# module -> its rule group's class
RULE_GROUPS = {"membership": "MembershipRules", "gossip": "GossipRules", "stem": "StemRules", "sync": "SyncRules",
               "forwarding": "ForwardingRules", "custody": "CustodyRules", "scoring": "ScoringRules",
               "rtt": "RttRules"}
# the reference a group (and the engine) holds to another group -> that group's class
GROUP_REFS = {f"_{m}_rules": c for m, c in RULE_GROUPS.items()}
# module -> the class whose `self` owns that module's OWNED attributes
OWNER_CLASS = {**RULE_GROUPS, "engine": "Engine"}


def classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    """The top-level classes of a module by name."""
    return {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == name), None)


def _self_assigned(fn: ast.FunctionDef) -> set[str]:
    """The attributes fn sets on self."""
    return {t.attr for n in ast.walk(fn) if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}


def built_attributes() -> dict[str, set[str]]:
    """Module -> the data attributes its engine or rule-group class sets on self in __init__ or `wire` (and
    state.py's RuleGroup.__init__: the context every group copies)."""
    out: dict[str, set[str]] = {}
    for module, cls_name in [*OWNER_CLASS.items(), ("state", "RuleGroup")]:
        cls = classes(ast.parse((CORE / f"{module}.py").read_text()))[cls_name]
        out[module] = {a for name in ("__init__", "wire") if (f := _method(cls, name)) for a in _self_assigned(f)}
    return out


def group_methods() -> dict[str, set[str]]:
    """Rule-group class -> the methods it defines."""
    out = {}
    for module, cls_name in RULE_GROUPS.items():
        cls = classes(ast.parse((CORE / f"{module}.py").read_text()))[cls_name]
        out[cls_name] = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
    return out


def test_every_engine_attribute_has_an_owner_or_is_listed_shared() -> None:
    built = built_attributes()
    attrs = set().union(*built.values())
    # HOOKS: an engine that does not override one holds the rule group's method under its name (engine.py)
    kinds = [set(OWNER_OBJECTS), set(OWNED), set(CONTEXT), set(SHARED), set(GROUP_REFS), set(HOOKS)]
    assert all(not (a & b) for i, a in enumerate(kinds) for b in kinds[i + 1:]), "an attribute of two kinds"
    unclassified = attrs - set().union(*kinds)
    assert not unclassified, f"give these attributes an owner (tests/test_core_owners.py): {unclassified}"
    gone = set().union(*kinds) - attrs - set(HOOKS)  # a hook is a method first (_tick only that)
    assert not gone, f"no longer built anywhere: remove them from tests/test_core_owners.py: {gone}"
    # an owned attribute is built by its owner's class and by no other
    misplaced = sorted(f"{a} (built in {m}.py, owned by {OWNED[a]}.py)" for m, names in built.items()
                       for a in names if a in OWNED and OWNED[a] != m)
    assert not misplaced, misplaced


def _nodes_in(tree: ast.Module, names: set[str], methods: set[str] | None = None) -> set[int]:
    """ids of the nodes inside the top-level classes named (only inside the methods named, if given)."""
    return {id(n) for c in tree.body if isinstance(c, ast.ClassDef) and c.name in names
            for f in c.body if methods is None or (isinstance(f, ast.FunctionDef) and f.name in methods)
            for n in ast.walk(f)}


def cross_owner_accesses(module: str, source: str) -> list[str]:
    """Accesses in `source` (inri/core/<module>.py) to an OWNED attribute other than through `self` in its
    owner's class, to another group's data through a group reference, or to a field of an owner object
    from outside its class: "module:line attribute"."""
    tree = ast.parse(source)
    own_class = _nodes_in(tree, {OWNER_CLASS[module]}) if module in OWNER_CLASS else set()
    groups_and_engine = _nodes_in(tree, set(OWNER_CLASS.values()))
    methods = group_methods()
    private = private_fields()
    found = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Attribute):
            continue
        on_self = isinstance(n.value, ast.Name) and n.value.id == "self"
        owner = OWNED.get(n.attr)
        # `self.x` in a class that is not a rule group (tables.py's RouteTable...) is that object's own field
        if owner is not None and (not on_self or id(n) in groups_and_engine) and (
                owner != module or not on_self or id(n) not in own_class):
            found.append(f"{module}:{n.lineno} {n.attr} (owned by {owner}.py)")
        if isinstance(n.value, ast.Attribute) and n.value.attr in GROUP_REFS:
            group = GROUP_REFS[n.value.attr]
            if n.attr not in methods[group]:
                found.append(f"{module}:{n.lineno} {n.attr} (not a method of {group})")
        cls = private.get(n.attr)
        if cls is not None and not on_self:  # an owner's own methods reach its fields through self only
            found.append(f"{module}:{n.lineno} {n.attr} (a field of {cls})")
    return sorted(set(found))


def context_rebindings(module: str, source: str) -> list[str]:
    """Assignments in a rule group or the engine of `source` (outside __init__, where each is built) to a
    CONTEXT attribute."""
    tree = ast.parse(source)
    watched = _nodes_in(tree, set(OWNER_CLASS.values())) - _nodes_in(tree, set(OWNER_CLASS.values()), {"__init__"})
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
            if isinstance(t, ast.Subscript) and ast.unparse(t.value) == "self.counters":
                continue  # the counters every group adds to (_count): one shared tally, never rebound
            if module == "engine" and ast.unparse(t) == "self._ctx.wall_offset":
                continue  # the driver's interface: Engine.wall_offset's setter
            a = t.value if isinstance(t, ast.Subscript | ast.Attribute) and isinstance(t.value, ast.Attribute) else t
            if (isinstance(a, ast.Attribute) and a.attr in CONTEXT and isinstance(a.value, ast.Name)
                    and a.value.id == "self" and id(a) in watched):
                found.append(f"{module}:{a.lineno} {a.attr}")
    return sorted(set(found))


def over_core(check: Callable[[str, str], list[str]]) -> list[str]:
    """check(module, source) over every module of inri/core."""
    return [f for path in sorted(CORE.glob("*.py")) for f in check(path.stem, path.read_text())]


def test_no_rule_group_rebinds_the_engines_context() -> None:
    found = over_core(context_rebindings)
    assert not found, "the engine's context is set at construction only:\n" + "\n".join(found)


def test_the_context_check_sees_a_rebinding() -> None:
    source = ("class ForwardingRules:\n    def f(self):\n        self.config = None\n        self.counters += 1\n"
              "        self.counters['x'] = 1\n        self._ctx.wall_offset = 1\n"
              "        self._linked['a'] = 1\n        self.config.x, y = 2, 3\n"
              "        self._linked['a'].last_sent = 3\n"
              "    def __init__(self):\n        self.config = None\n"
              "class Other:\n    def g(self):\n        self.config = None\n")
    assert context_rebindings("forwarding", source) == [
        "forwarding:3 config", "forwarding:4 counters", "forwarding:6 _ctx", "forwarding:7 _linked",
        "forwarding:8 config"]


def test_no_rule_group_touches_another_owners_state() -> None:
    found = over_core(cross_owner_accesses)
    assert not found, "cross-owner accesses (use the owner's methods):\n" + "\n".join(found)


def test_owner_fields_are_private_outside_the_core_too() -> None:
    """Tests, the simulator and benchmarks use owner objects through their methods as well, and reach a
    rule group's own state only through its methods."""
    private = private_fields()
    found = []
    for folder in ("simulations", "benchmarks", "tests", "inri/node"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for n in ast.walk(ast.parse(path.read_text())):
                if not isinstance(n, ast.Attribute) or not isinstance(n.value, ast.Attribute):
                    continue
                if n.attr in private and n.value.attr in OWNER_OBJECTS:
                    found.append(f"{path.relative_to(ROOT)}:{n.lineno} {n.value.attr}.{n.attr}")
                if n.value.attr in GROUP_REFS and n.attr in OWNED:
                    found.append(f"{path.relative_to(ROOT)}:{n.lineno} {n.value.attr}.{n.attr}")
    assert not found, found


def test_the_check_sees_a_cross_owner_access() -> None:
    """The checker itself: a rule group reading another group's state (through self or through the other
    group), using a group reference for data, or reading an owner object's field, is found."""
    forwarding = ("class ForwardingRules:\n    def f(self):\n"
                  "        return self._steer, self._blamed, self._rtt._srtt, self._tree._missing\n"
                  "    def g(self):\n"
                  "        return self._routes._expire_from, self._routes._peer_ix, self._routes.get(b'')\n"
                  "    def h(self):\n"
                  "        return self._scoring_rules._blamed, self._scoring_rules.score, self._custody_rules.x\n")
    assert cross_owner_accesses("forwarding", forwarding) == [
        "forwarding:3 _blamed (owned by scoring.py)", "forwarding:3 _missing (a field of TreeGossip)",
        "forwarding:3 _srtt (a field of RttEstimator)",
        "forwarding:5 _expire_from (a field of CompactRouteTable or RouteTable)",
        "forwarding:5 _peer_ix (a field of CompactRouteTable)",
        "forwarding:7 _blamed (not a method of ScoringRules)", "forwarding:7 _blamed (owned by scoring.py)",
        "forwarding:7 x (not a method of CustodyRules)"]
    # the engine reaching a group's state, even through the group
    engine = "class Engine:\n    def f(self):\n        return self._forwarding_rules._steer, self._steer\n"
    assert cross_owner_accesses("engine", engine) == [
        "engine:3 _steer (not a method of ForwardingRules)", "engine:3 _steer (owned by forwarding.py)"]
    # a class that is not a rule group has fields of its own
    assert cross_owner_accesses("tables", "class RouteTable:\n    def f(self):\n        return self._steer\n") == []


def test_owner_objects_have_slots_only() -> None:
    """An owner object's state is its __slots__ (no __dict__ to grow an attribute elsewhere)."""
    for cls in owner_classes():
        assert "__dict__" not in dir(cls), cls
        assert all(f.startswith("_") for f in cls.__slots__), cls


def test_each_group_declares_only_its_own_state() -> None:
    """A rule group's class-level declarations are its own state and the groups it calls (annotated with
    their classes), so reading that module shows the state it owns and whom it calls."""
    misplaced = []
    for module, cls_name in RULE_GROUPS.items():
        cls = classes(ast.parse((CORE / f"{module}.py").read_text()))[cls_name]
        for b in cls.body:
            if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name):
                name = b.target.id
                if OWNED.get(name) != module and name not in GROUP_REFS:
                    misplaced.append(f"{module}.py {cls_name}.{name}")
                elif name in GROUP_REFS and ast.unparse(b.annotation) != GROUP_REFS[name]:
                    misplaced.append(f"{module}.py {cls_name}.{name}: annotate it {GROUP_REFS[name]}")
    assert not misplaced, misplaced


def _is_stub(f: ast.FunctionDef) -> bool:
    """A body of `...` (after an optional docstring): a declaration for the type checker."""
    body = f.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
        and body[0].value.value is Ellipsis


def method_stubs(sources: dict[str, str]) -> list[str]:
    """Declarations in `sources` (module -> source) of a rule group's method outside its class: a stub
    (`...` body) of that name in any class, or any method in an `if TYPE_CHECKING:` block of a class body."""
    defined: set[str] = set()  # names without their leading underscores: a stub renamed so is found too
    for module, cls_name in RULE_GROUPS.items():
        cls = classes(ast.parse(sources[module])).get(cls_name)
        if cls is not None:
            defined |= {f.name.lstrip("_") for f in cls.body if isinstance(f, ast.FunctionDef) and not _is_stub(f)
                        and not f.name.startswith("__")}
    found = []
    for module, source in sorted(sources.items()):
        for c in ast.walk(ast.parse(source)):
            if not isinstance(c, ast.ClassDef):
                continue
            for f in ast.walk(c):
                if isinstance(f, ast.FunctionDef) and f.name.lstrip("_") in defined and _is_stub(f):
                    found.append(f"{module}:{f.lineno} {c.name}.{f.name}")
            for b in c.body:
                if isinstance(b, ast.If) and "TYPE_CHECKING" in ast.unparse(b.test):
                    found += [f"{module}:{f.lineno} {c.name}.{f.name} (if TYPE_CHECKING)" for f in ast.walk(b)
                              if isinstance(f, ast.FunctionDef) and f.name.lstrip("_") in defined]
    return sorted(set(found))


def test_no_method_stubs_for_calls_between_rule_groups() -> None:
    """Calls between rule groups go through typed references to the other group (GROUP_REFS), never through
    declarations of its methods elsewhere (state.py's EngineState had 41; a Protocol would be the same)."""
    found = method_stubs({p.stem: p.read_text() for p in CORE.glob("*.py")})
    assert not found, "method stubs of rule groups (call the group through its reference):\n" + "\n".join(found)


def test_the_stub_check_sees_a_stub() -> None:
    sources = {m: f"class {c}:\n    def settle(self) -> None:\n        return None\n" for m, c in RULE_GROUPS.items()}
    sources["state"] = ("from typing import Protocol, TYPE_CHECKING\n"
                        "class Custodian(Protocol):\n    def settle(self) -> None:\n        \"Doc.\"\n        ...\n"
                        "class Base:\n    if TYPE_CHECKING:\n        def _settle(self) -> int: ...\n"
                        "        def other(self) -> int: ...\n"
                        "class Fine:\n    def run(self) -> None: ...\n")
    assert method_stubs(sources) == [
        "state:3 Custodian.settle", "state:8 Base._settle", "state:8 Base._settle (if TYPE_CHECKING)"]


def owner_rebindings(path: str, source: str) -> list[str]:
    """Assignments (or deletions) of an owner object or a rule-group reference outside an __init__ or
    `wire`, or of the context on another object (`engine.config = ...`): the engine and its groups hold the
    same objects, so a rebound one would split them."""
    tree = ast.parse(source)
    building = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name in ("__init__", "wire")
                for n in ast.walk(f)}
    names = set(OWNER_OBJECTS) | set(GROUP_REFS) | {"_linked"}
    found = []
    for n in ast.walk(tree):
        targets = (n.targets if isinstance(n, ast.Assign | ast.Delete) else
                   [n.target] if isinstance(n, ast.AugAssign | ast.AnnAssign) else [])
        for t in targets:
            if isinstance(t, ast.Attribute) and id(t) not in building and (t.attr in names or (
                    t.attr in CONTEXT and not (isinstance(t.value, ast.Name) and t.value.id == "self"))):
                found.append(f"{path}:{t.lineno} {t.attr}")
    return found


def test_no_owner_object_or_group_is_rebound() -> None:
    paths = [p for d in ("inri", "simulations", "benchmarks", "tests") for p in sorted((ROOT / d).rglob("*.py"))]
    found = [f for p in paths for f in owner_rebindings(str(p.relative_to(ROOT)), p.read_text())]
    assert not found, "owner objects and rule groups are built once (Engine.__init__):\n" + "\n".join(found)


def test_the_rebinding_check_sees_a_rebinding() -> None:
    source = ("class E:\n    def __init__(self):\n        self._routes = 1\n        self._gossip_rules = 2\n"
              "def f(eng):\n    eng._routes = 3\n    eng._linked = 4\n    eng._gossip_rules.x = 5\n"
              "    del eng._seen\n    eng.config = 6\n")
    assert owner_rebindings("t.py", source) == ["t.py:6 _routes", "t.py:7 _linked", "t.py:9 _seen", "t.py:10 config"]
