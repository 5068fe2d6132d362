"""The code's shape, read with `ast`: modules talk through named interfaces, never through each
other's underscore names; no function is longer than 60 lines; one place asks the algorithm rule.

Nothing here imports fastcoll: each rule reads the source of fastcoll/ as it stands.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field

from conftest import ROOT

PACKAGE = os.path.join(ROOT, "fastcoll")
MAX_FUNCTION_LINES = 60

# Functions allowed over the limit (none now; an entry would have to say why).
KNOWN_LONG: set[tuple[str, str]] = set()

@dataclass
class Module:
    """One source file of fastcoll/: its path, dotted name and tree."""

    path: str
    name: str
    tree: ast.Module
    defined: set[str] = field(default_factory=set)  # underscore names it defines itself


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def modules() -> list[Module]:
    found = []
    for folder, _, files in os.walk(PACKAGE):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
                name = rel[:-3].replace("/", ".").removesuffix(".__init__")
                with open(path) as fh:
                    found.append(Module(rel, name, ast.parse(fh.read(), rel)))
    for m in found:
        for node in ast.walk(m.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                m.defined.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                m.defined.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                m.defined.add(node.id)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                m.defined.add(node.target.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and private(node.value):
                m.defined.add(node.value)  # __slots__ entries, getattr names
        m.defined = {n for n in m.defined if private(n)}
    return found


def imported_modules(m: Module, names: set[str]) -> dict[str, str]:
    """The local names that `m` binds to fastcoll modules, and which module each is."""
    bound = {}
    for node in ast.walk(m.tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("fastcoll"):
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else "fastcoll"
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fastcoll"):
            for a in node.names:
                if f"{node.module}.{a.name}" in names:
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"
    return bound


def own_package(m: Module, module: str) -> bool:
    """Whether `module` is m itself or a package that holds m (whose private parts are m's too)."""
    return m.name == module or m.name.startswith(module + ".")


def private_uses(m: Module, everyone: list[Module]) -> list[str]:
    """Where `m` takes an underscore name of another fastcoll module: `from x import _y`,
    `x._y` on a module x, or `obj._y` for a name that only other modules define."""
    names = {o.name for o in everyone}
    elsewhere = set().union(*(o.defined for o in everyone if o is not m)) - m.defined
    bound = imported_modules(m, names)
    found = []
    for node in ast.walk(m.tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fastcoll"):
            for a in node.names:
                if private(a.name) and not own_package(m, node.module):
                    found.append(f"{m.path}:{node.lineno}: from {node.module} import {a.name}")
        elif isinstance(node, ast.Attribute) and private(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and base.id in bound:
                if bound[base.id] != m.name:
                    found.append(f"{m.path}:{node.lineno}: {base.id}.{node.attr} (module {bound[base.id]})")
            elif not (isinstance(base, ast.Name) and base.id in ("self", "cls")) and node.attr in elsewhere:
                found.append(f"{m.path}:{node.lineno}: {ast.unparse(base)}.{node.attr}")
    return found


def test_no_module_uses_another_modules_underscore_names():
    everyone = modules()
    found = [use for m in everyone for use in private_uses(m, everyone)]
    assert not found, "\n".join(found)


def test_the_check_sees_each_kind_of_private_use():
    """The rule above, on a made-up module: it must flag what it is for, and only that."""
    source = (
        "from fastcoll.engine import _native\n"  # its own package's private module: allowed
        "from fastcoll.group import _PLANS_MAX\n"
        "from fastcoll import lifecycle\n"
        "lifecycle._default\n"
        "def f(g):\n"
        "    g._seq += 1\n"
        "    self._own = 1\n"
        "    return g._own\n"
    )
    m = Module("fastcoll/engine/made_up.py", "fastcoll.engine.made_up", ast.parse(source))
    m.defined = {"_own"}
    others = [Module("fastcoll/group.py", "fastcoll.group", ast.parse(""), {"_PLANS_MAX", "_seq"}),
              Module("fastcoll/lifecycle.py", "fastcoll.lifecycle", ast.parse(""), {"_default"}),
              Module("fastcoll/engine/_native.py", "fastcoll.engine._native", ast.parse(""))]
    found = private_uses(m, [m, *others])
    assert [u.split(": ", 1)[1] for u in found] == [
        "from fastcoll.group import _PLANS_MAX", "lifecycle._default (module fastcoll.lifecycle)", "g._seq"], found


def function_lengths() -> dict[tuple[str, str], int]:
    """(file, function) -> lines from its first decorator to its last line, for every function."""
    out = {}
    for m in modules():
        for node in ast.walk(m.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                out[(m.path, node.name)] = max(out.get((m.path, node.name), 0), node.end_lineno - first + 1)
    return out


def test_no_function_is_longer_than_60_lines():
    lengths = function_lengths()
    long = {k: n for k, n in lengths.items() if n > MAX_FUNCTION_LINES}
    assert set(long) <= KNOWN_LONG, "\n".join(f"{p}: {f} has {n} lines" for (p, f), n in sorted(long.items())
                                               if (p, f) not in KNOWN_LONG)
    for key in KNOWN_LONG:
        assert key in long, f"{key} is {lengths.get(key)} lines now: drop it from KNOWN_LONG"


def test_one_place_asks_the_algorithm_rule_and_every_op_names_its_algorithm():
    """`Group.choose` is the only caller of fastcoll/algorithms/select.py's rule, and every Op
    built outside the engine says which algorithm runs it (an Op's default is no choice)."""
    asks, silent = [], []
    for m in modules():
        if m.name.startswith(("fastcoll.algorithms", "fastcoll.engine")):
            continue
        for node in ast.walk(m.tree):
            if not isinstance(node, ast.Call):
                continue
            called = ast.unparse(node.func)
            if called in ("select.algorithm", "select.choose"):
                asks.append(m.path)
            if called == "Op" and len(node.args) < 2 and not any(k.arg == "algorithm" for k in node.keywords):
                silent.append(f"{m.path}:{node.lineno}")
    assert asks == ["fastcoll/group.py"], asks
    assert not silent, silent


# --- the native engine's rooms (fastcoll/engine/csrc/README.md) ----------------------------------

CSRC = os.path.join(PACKAGE, "engine", "csrc")
MPI_CSRC = os.path.join(PACKAGE, "mlx_compat", "csrc")


@dataclass
class Room:
    door: set[str]
    may: set[str]


def rooms() -> dict[str, Room]:
    """The rooms table of csrc/README.md: room -> its door and the rooms it may include."""
    found = {}
    with open(os.path.join(CSRC, "README.md")) as fh:
        for line in fh:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 4 and cells[0].startswith("`"):
                names = lambda cell: {w.strip("`, ") for w in cell.split(",") if w.strip("`, ")}
                may = names(cells[3]) if cells[3] != "every room above" else set(found)
                found[cells[0].strip("`")] = Room(names(cells[2]), may)
    return found


def include_problems(path: str, room: str, text: str, table: dict[str, Room]) -> list[str]:
    """What in `text` (the file at `path`, in `room`) includes outside what the table allows."""
    found = []
    for line in text.splitlines():
        s = line.strip()
        if not s.startswith('#include "'):
            continue
        name = s.split('"')[1]
        if "/" not in name:
            continue  # its own folder's header
        other, header = name.split("/", 1)[0], os.path.basename(name)
        if other == room:
            continue
        if other not in table:
            found.append(f"{path}: includes {name}, which is in no room")
        elif other not in table[room].may:
            found.append(f"{path} ({room}) includes {name}: {room} may not include {other}")
        elif header not in table[other].door:
            found.append(f"{path} ({room}) includes {name}, which is not in {other}'s door")
    return found


def test_every_c_file_lives_in_a_room_and_includes_only_what_its_room_may():
    table = rooms()
    assert list(table) == ["base", "reduce", "links", "core", "algorithms", "gate", "binding"], table
    table["mpi"] = Room(set(), {"binding", "reduce"})  # the MPI library: the graph table and reductions
    problems, seen = [], 0
    for top, room_of in ((CSRC, None), (MPI_CSRC, "mpi")):
        for folder, _, files in os.walk(top):
            for f in files:
                if not f.endswith((".c", ".h")):
                    continue
                path = os.path.relpath(os.path.join(folder, f), ROOT)
                room = room_of or os.path.relpath(folder, CSRC).split(os.sep)[0]
                if room not in table:
                    problems.append(f"{path}: not in a room of csrc/README.md")
                    continue
                with open(os.path.join(folder, f)) as fh:
                    problems += include_problems(path, room, fh.read(), table)
                seen += 1
    assert seen > 40 and not problems, "\n".join(problems)


def test_the_room_check_sees_a_climb_and_a_private_header():
    table = rooms()
    text = '#include "fc_link.h"\n#include "core/fc_engine.h"\n#include "links/verbs/fc_verbs.h"\n#include "x/y.h"\n'
    found = include_problems("made_up.c", "links", text, table)
    assert found == ["made_up.c (links) includes core/fc_engine.h: links may not include core",
                     "made_up.c: includes x/y.h, which is in no room"], found
    assert include_problems("made_up.c", "binding", '#include "links/verbs/fc_verbs.h"\n', table) == [
        "made_up.c (binding) includes links/verbs/fc_verbs.h, which is not in links's door"]


# Layers the import graph keeps (../shared/architecture.json's `never`s that Python imports can
# break): who may not import whom. A module name matches itself and everything under it; "fastcoll"
# alone means the package's own __init__ (the public API), not its submodules.
JOB = ("fastcoll.config", "fastcoll.lifecycle", "fastcoll.group", "fastcoll.service", "fastcoll.job")
DEVICES = ("fastcoll.gpu", "fastcoll.metal", "fastcoll.cuda")
NEVER = [
    (DEVICES, "fastcoll.gate", "the GPU languages know no gate; it passes its defines in"),
    (JOB, "fastcoll.transport", "the job reaches links only through the engine"),
    (("fastcoll.transport",), "fastcoll", "links know no collectives"),
    (("bench",), "fastcoll.launch", "a benchmark starts jobs as users do"),
]


def fastcoll_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every fastcoll import; `from fastcoll import x` is 'fastcoll.x' where x is a
    submodule (lowercase file or folder), else 'fastcoll' (a name of the package's __init__)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "fastcoll"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "fastcoll":
            for a in node.names:
                sub = os.path.join(ROOT, *node.module.split("."), a.name)
                found.append((node.lineno, f"{node.module}.{a.name}"
                              if os.path.isdir(sub) or os.path.isfile(sub + ".py") else node.module))
    return found


def under(name: str, module: str) -> bool:
    return name == module or (module != "fastcoll" and name.startswith(module + "."))


def layer_breaks(name: str, path: str, tree: ast.Module) -> list[str]:
    found = []
    for sources, target, why in NEVER:
        if any(under(name, s) for s in sources):
            found += [f"{path}:{line}: imports {m} ({why})" for line, m in fastcoll_imports(tree) if under(m, target)]
    return found


def test_no_import_crosses_a_never_of_the_layers():
    """The job, the links and the benchmark import only what their layers may (bench/records/ holds
    scripts of their time, not the benchmark)."""
    found = [b for m in modules() for b in layer_breaks(m.name, m.path, m.tree)]
    for folder, dirs, files in os.walk(os.path.join(ROOT, "bench")):
        dirs[:] = [d for d in dirs if d != "records"]
        for f in (f for f in files if f.endswith(".py")):
            rel = os.path.relpath(os.path.join(folder, f), ROOT)
            with open(os.path.join(folder, f)) as fh:
                found += layer_breaks("bench." + rel[:-3].replace(os.sep, "."), rel, ast.parse(fh.read(), rel))
    assert not found, "\n".join(found)


def test_the_layer_check_sees_each_kind_of_crossing():
    text = ("from fastcoll import transport\nfrom fastcoll.transport.shm import host_id\nimport fastcoll.launch.agent\n"
            "from fastcoll import __version__, engine\nfrom fastcoll.wire import VERSION\n")
    tree = ast.parse(text)
    assert layer_breaks("fastcoll.config", "c.py", tree) == [
        "c.py:1: imports fastcoll.transport (the job reaches links only through the engine)",
        "c.py:2: imports fastcoll.transport.shm (the job reaches links only through the engine)"]
    assert layer_breaks("fastcoll.transport.tcp", "t.py", tree) == ["t.py:4: imports fastcoll (links know no collectives)"]
    assert layer_breaks("bench.harness", "h.py", tree) == [
        "h.py:3: imports fastcoll.launch.agent (a benchmark starts jobs as users do)"]
    gpu = ast.parse("from fastcoll.gpu.language import Language\nfrom fastcoll.gate.protocol import layout\n"
                    "from fastcoll import gate\nimport fastcoll.gate.device.kernels\nfrom fastcoll.gateway import x\n")
    why = "the GPU languages know no gate; it passes its defines in"
    assert layer_breaks("fastcoll.cuda.advise", "a.py", gpu) == [
        f"a.py:2: imports fastcoll.gate.protocol.layout ({why})", f"a.py:3: imports fastcoll.gate ({why})",
        f"a.py:4: imports fastcoll.gate.device.kernels ({why})"]
    assert layer_breaks("fastcoll.gate.device.kernels", "k.py", gpu) == []  # the gate may import the GPU side


# bench/'s Python (its scripts and workers; bench/records/ holds scripts of their time) within its
# cap: a benchmark that outgrows it repeats itself somewhere (bench/README.md, "Scripts that are gone").
BENCH_CAP = 2400


def python_lines(folders: list[str]) -> dict[str, int]:
    """Lines of each .py file directly in `folders` (not below them), by path from ROOT."""
    found = {}
    for folder in folders:
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            if name.endswith(".py"):
                with open(os.path.join(ROOT, folder, name)) as f:
                    found[os.path.join(folder, name)] = sum(1 for _ in f)
    return found


def over_cap(lines: dict[str, int], cap: int) -> str | None:
    """None within `cap`, else the total and the five largest files, largest first."""
    total = sum(lines.values())
    if total <= cap:
        return None
    largest = sorted(lines.items(), key=lambda kv: -kv[1])[:5]
    return f"{total} lines, cap {cap}; largest: " + ", ".join(f"{path} {n}" for path, n in largest)


def test_bench_python_stays_within_its_cap():
    lines = python_lines(["bench", os.path.join("bench", "workers")])
    assert "bench/harness.py" in lines and not any("records" in path for path in lines)
    problem = over_cap(lines, BENCH_CAP)
    assert problem is None, problem


def test_the_cap_check_names_the_largest_files():
    lines = {"bench/a.py": 10, "bench/b.py": 30, "bench/c.py": 20}
    assert over_cap(lines, 60) is None
    assert over_cap(lines, 59) == "60 lines, cap 59; largest: bench/b.py 30, bench/c.py 20, bench/a.py 10"
