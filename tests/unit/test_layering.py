"""The shape the style guide asks for, enforced: recording and adapters talk to the OTel
API only; the SDK, exporters and prometheus_client are imported in export/ (and by the
public testing helpers) alone."""

from __future__ import annotations

import ast
import itertools
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PKG = Path(__file__).resolve().parents[2] / "otel_train"
SDK_SIDE = ("opentelemetry.sdk", "opentelemetry.exporter", "prometheus_client")
FRAMEWORKS = ("transformers", "lightning", "pytorch_lightning", "torchtitan", "accelerate")


def imports(path: Path) -> list[tuple[str, int]]:
    """(absolute or package-relative module, level) of every import in a file."""
    tree = ast.parse(path.read_text())
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, 0) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.module or "", node.level))
    return out


def files(sub: str) -> list[Path]:
    return sorted((PKG / sub).rglob("*.py"))


@pytest.mark.parametrize("sub", ["recording", "processing", "adapters"])
def test_recording_and_adapters_use_the_api_only(sub: str) -> None:
    for path in files(sub):
        for module, level in imports(path):
            assert not (level == 0 and module.startswith(SDK_SIDE)), f"{path.name} imports {module}"
            assert not (level and module.split(".")[0] == "export"), f"{path.name} imports export"


def test_recording_does_not_import_adapters_or_frameworks() -> None:
    for path in files("recording") + files("processing"):
        for module, level in imports(path):
            assert not (level and "adapters" in module), f"{path.name} imports {module}"
            assert not module.startswith(FRAMEWORKS), f"{path.name} imports {module}"


def test_adapters_import_frameworks_lazily() -> None:
    for path in files("adapters"):
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level only: function bodies may import lazily
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
                for name in names:
                    assert not name.startswith(FRAMEWORKS), f"{path.name} imports {name} eagerly"


def test_sdk_is_built_in_one_place() -> None:
    allowed = {PKG / "testing.py", *files("export")}
    for path in sorted(PKG.rglob("*.py")):
        if path in allowed:
            continue
        for module, level in imports(path):
            assert not (level == 0 and module.startswith(SDK_SIDE)), f"{path.name} imports {module}"


# What `make lint` checks besides the package.
LINTED = ("otel_train", "tests", "benchmarks", "examples", "grafana")


@pytest.mark.parametrize("tool", ["ruff", "ruff-format", "mypy"])
def test_lint_and_types_are_clean(tool: str) -> None:
    exe = shutil.which(tool.split("-")[0], path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip(f"{tool} not installed (pip install 'otel-train[dev]')")
    cmd = {
        "ruff": [exe, "check", *LINTED],
        "ruff-format": [exe, "format", "--check", *LINTED],
        "mypy": [exe, str(PKG)],
    }[tool]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=PKG.parent)
    assert done.returncode == 0, done.stdout + done.stderr


# The order of the layers -------------------------------------------------------------
# Every module's part is its first name under otel_train/ ("otel_train" for the package's
# own __init__.py, which names the public API of api.py). Each part may import its own
# modules and the parts listed here, nothing else; the drawing in otel_train/__init__.py
# shows the same.
# Counted: every import, at module level or inside functions (lazy ones too), and those
# under ``if TYPE_CHECKING:``: an annotation-only import ties its module to the other all
# the same (mypy reads it, and a cycle of them is a cycle a reader has to untangle).
BASE = frozenset({"identity", "contract", "settings"})
LAYERS: dict[str, frozenset[str]] = {
    # the foundation: nothing of the package but each other
    "identity": frozenset(),  # the debug components load it by its path, alone
    "contract": BASE - {"contract"},  # a package: one part, its modules import each other
    "settings": BASE - {"settings"},
    "signals": BASE,
    "debug": frozenset({"identity"}),  # loadable without the rest of otel-train
    # the core's training-thread side: knows no consumer, adapter, exporter or sidecar
    "recording": BASE | {"debug"},
    # the core's consumer side: resolved steps, metrics, tables, spans (reads recording)
    "processing": BASE | {"recording"},
    "export": BASE | {"recording", "processing"},  # the SDK side: reads the aggregates
    "adapters": BASE | {"recording"},  # leaves over the core; talk to the OTel API only
    "wiring": BASE | {"recording", "processing", "export"},  # the consumer side, built once
    # the training process's end of the sidecar (feeder, raw hand-over, pipes, relay in)
    "handover": BASE | {"recording", "processing", "export", "wiring"},
    # the sidecar process: imported by no part (handover/process.py starts it by name)
    "sidecar": BASE | {"recording", "processing", "export", "wiring", "handover"},
    "session": BASE
    | {"signals", "debug", "recording", "processing", "export"}
    | {"wiring", "handover", "session_end"},
    "session_end": frozenset(),  # a session's flush and end (it is handed the session)
    # the package: names the public API, each name loaded at its first use
    "otel_train": BASE | {"api", "session", "adapters"},
    "api": BASE | {"session", "adapters", "recording"},  # the public API's functions
    # reads run records (export/record.py writes them)
    "runs": BASE | {"export", "recording", "processing"},
    "cli": BASE | {"otel_train", "runs"},
    # opentelemetry-instrument's entry point: the process-wide adapter and trainers
    "instrumentor": BASE | {"otel_train", "session", "adapters"},
    "testing": BASE | {"export", "session"},  # test helpers: providers, flush, reset
}
# Why the edges that matter most are absent: the message a violation carries.
REASONS: dict[tuple[str, str], str] = {
    ("recording", "processing"): "the training-thread side hands steps on and never reads "
    "the consumer side's types: the consumer side reads the recorder",
    ("recording", "adapters"): "the core never knows its adapters: they are leaves over it",
    ("recording", "export"): "the core talks to the OTel API only; the SDK side reads it",
    ("recording", "sidecar"): "the sidecar is a process of its own, imported by no part",
    ("session", "sidecar"): "the sidecar is a process of its own, imported by no part",
    ("recording", "handover"): "the hand-over is started by session.py alone",
    ("export", "adapters"): "exporting knows nothing of trainers",
    ("adapters", "export"): "adapters talk to the OTel API only (the SDK is built in export/)",
    ("adapters", "session"): "adapters are handed their session (Instrumentation.session)",
    ("debug", "adapters"): "debug components load without the rest of otel-train",
    ("debug", "export"): "debug components load without the rest of otel-train",
    ("debug", "recording"): "debug components load without the rest of otel-train",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def part_of(module: str) -> str:
    names = module.split(".")
    return names[1] if len(names) > 1 else names[0]


def package_imports(path: Path, modules: set[str]) -> list[tuple[str, int, bool]]:
    """(otel_train module, line, at module level) of every import of the package in
    ``path``, those under ``if TYPE_CHECKING:`` included (at module level when the ``if``
    is). A ``from X import name`` names the module ``X.name`` when that is one, else
    ``X``."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        if isinstance(node, ast.Import):
            out.extend((a.name, node.lineno, top) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                names = package.split(".")
                base = names[: len(names) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                full = f"{source}.{alias.name}"
                out.append((full if full in modules else source, node.lineno, top))
        lazy = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, top and not lazy)

    visit(ast.parse(path.read_text()), True)
    return [
        (m, line, top) for m, line, top in out if m == "otel_train" or m.startswith("otel_train.")
    ]


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {otel_train module it imports at module level: line}, annotation-only
    imports included. Lazy imports (in functions) are left out. Importing ``a.b.c`` also
    runs the packages ``a`` and ``a.b`` (their __init__.py, where there is one) unless
    they are the importer's ancestors, already being imported."""
    modules = package_modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        for target, line, top in package_imports(path, set(modules)):
            if not top:
                continue
            names = target.split(".")
            implied = {".".join(names[:i]) for i in range(1, len(names))} - ancestors
            for t in (*sorted(implied), target):
                if t in modules and t != name:
                    edges.setdefault(t, line)
        graph[name] = edges
    return graph


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Every distinct cycle a depth-first search meets, each as [a, b, ..., a]."""
    cycles: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                cycle = [*path[path.index(nxt) :], nxt]
                key = frozenset(cycle)
                if key not in seen:
                    seen.add(key)
                    cycles.append(cycle)
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_cycle_finder_names_the_cycle() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}, "e": {"e": 5}}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "e"]]
    assert find_cycles({"a": {"b": 1}, "b": {}}) == []


def test_no_import_cycles_among_the_package_modules() -> None:
    graph = import_graph()
    assert graph.get("otel_train.adapters.hf"), "no imports found: the graph is empty"
    cycles = find_cycles(graph)
    described = [
        c[0] + "".join(f" --(line {graph[a][b]})--> {b}" for a, b in itertools.pairwise(c))
        for c in cycles
    ]
    assert not cycles, (
        "import cycles at module level (make one of the imports lazy, inside the function "
        "that needs it, or move the shared code down a layer):\n" + "\n".join(described)
    )


def test_every_part_has_a_place_in_the_layers() -> None:
    parts = {part_of(m) for m in package_modules()}
    unknown = sorted(parts - set(LAYERS))
    assert not unknown, (
        f"otel_train has new top-level parts {unknown}: add each to LAYERS in "
        f"{Path(__file__).name} (what it may import) and to the drawing in otel_train/__init__.py"
    )


def test_each_part_imports_only_the_layers_below_it() -> None:
    modules = package_modules()
    wrong: list[str] = []
    for name, path in modules.items():
        part = part_of(name)
        allowed = LAYERS.get(part)
        if allowed is None:
            continue  # test_every_part_has_a_place_in_the_layers names it
        for target, line, _ in package_imports(path, set(modules)):
            other = part_of(target)
            if other == part or other in allowed:
                continue
            rule = (
                f"{part} may import only {sorted(allowed)}" if allowed else f"{part} imports none"
            )
            why = REASONS.get((part, other), rule)
            wrong.append(f"{path.relative_to(PKG.parent)}:{line} imports {target}: {why}")
    assert not wrong, "imports against the order of the layers:\n" + "\n".join(wrong)


def test_the_layer_rules_hold_the_issue_edges() -> None:
    """The table itself: an edge the layering forbids is not quietly allowed."""
    for (importer, imported), why in REASONS.items():
        assert imported not in LAYERS[importer], f"LAYERS lets {importer} import {imported}: {why}"
    assert "recording" in LAYERS["adapters"]
    importers = sorted(p for p, allowed in LAYERS.items() if "sidecar" in allowed)
    assert importers == [], f"the sidecar process is imported by no part, not {importers}"
    importers = sorted(p for p, allowed in LAYERS.items() if "handover" in allowed)
    assert importers == ["session", "sidecar"], f"the hand-over: session and wire, not {importers}"


def test_the_package_docstring_draws_every_layer() -> None:
    doc = ast.get_docstring(ast.parse((PKG / "__init__.py").read_text())) or ""
    missing = [p for p in LAYERS if p != "otel_train" and p not in doc]
    assert not missing, f"otel_train/__init__.py's docstring does not draw {missing}"


# The contract's own modules, in the order otel_train/contract/__init__.py draws: each
# imports only the modules named here, and nothing else of otel-train.
CONTRACT_PARTS: dict[str, frozenset[str]] = {
    "specs": frozenset(),
    "attributes": frozenset({"specs"}),
    "events": frozenset({"specs", "attributes"}),
    "metrics": frozenset({"specs"}),
    "spans": frozenset({"specs", "attributes", "events"}),
    "prometheus": frozenset({"specs"}),
    "derived": frozenset({"specs", "metrics", "prometheus"}),
    "conventions": frozenset({"metrics"}),
    "schema": frozenset({"specs", "metrics"}),
    "markdown": frozenset(
        {
            "specs",
            "attributes",
            "events",
            "metrics",
            "prometheus",
            "spans",
            "derived",
            "conventions",
            "schema",
        }
    ),
}


def test_the_contract_modules_import_only_those_below_them() -> None:
    modules = package_modules()
    mine = {m.rpartition(".")[2] for m in modules if m.startswith("otel_train.contract.")}
    assert mine - {"__main__"} == set(CONTRACT_PARTS), "add the new module to CONTRACT_PARTS"
    wrong: list[str] = []
    for part, allowed in CONTRACT_PARTS.items():
        path = modules[f"otel_train.contract.{part}"]
        for target, line, _ in package_imports(path, set(modules)):
            if target.rpartition(".")[0] != "otel_train.contract" or (
                target.rpartition(".")[2] not in allowed
            ):
                wrong.append(f"{path.relative_to(PKG.parent)}:{line} imports {target}")
    assert not wrong, "contract modules against their drawn order:\n" + "\n".join(wrong)


# The adapters' shared core: an adapter module imports these, never a sibling adapter.
ADAPTER_CORE = (
    "otel_train.adapters",
    "otel_train.adapters.base",
    "otel_train.adapters.backward",
    "otel_train.adapters.batches",
    "otel_train.adapters.collectives",
    "otel_train.adapters.compiling",
    "otel_train.adapters.ddp",
    "otel_train.adapters.own_class",
    "otel_train.adapters.scaler",
)


# An adapter that is another one fed differently (not a second implementation).
ADAPTER_VARIANTS = {
    # the plain-loop adapter, its boundaries from torch's process-wide hooks
    "otel_train.adapters.process_wide": {"otel_train.adapters.torch_loop"},
}


def test_adapters_import_the_shared_core_not_each_other() -> None:
    modules = package_modules()
    wrong: list[str] = []
    for name, path in modules.items():
        if part_of(name) != "adapters" or name == "otel_train.adapters":
            continue  # adapters/__init__.py selects the adapter: it imports each, lazily
        allowed = ADAPTER_CORE + tuple(ADAPTER_VARIANTS.get(name, ()))
        for target, line, _ in package_imports(path, set(modules)):
            if part_of(target) == "adapters" and target not in allowed:
                wrong.append(f"{path.relative_to(PKG.parent)}:{line} imports {target}")
    assert not wrong, (
        "an adapter imports another adapter; shared machinery belongs in adapters/base.py, "
        "backward.py, batches.py, collectives.py, compiling.py, ddp.py, own_class.py or "
        "scaler.py:\n" + "\n".join(wrong)
    )


MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def test_no_module_over_500_lines_and_no_function_over_60() -> None:
    """The sizes issue 24 set: a module a maintainer can read, a function that fits."""
    over = []
    for path in files(""):
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            over.append(f"{path.relative_to(PKG)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    over.append(f"{path.relative_to(PKG)}:{node.lineno} {node.name}: {length}")
    assert not over, over


# A core to live in (issue 37) ------------------------------------------------------------
# Two counts over otel_train/, each printed and held at 0: private attributes of one module
# used in another (48 when issue 37 counted them), and methods replaced on an instance or
# patched on a class (the recorder's hook entry points were, until they became fields).


def class_defs() -> dict[str, list[tuple[str, ast.ClassDef]]]:
    """Every class of the package by name: [(module, its ClassDef)]."""
    out: dict[str, list[tuple[str, ast.ClassDef]]] = {}
    for name, path in package_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append((name, node))
    return out


def functions_in(tree: ast.AST) -> Iterator[tuple[ast.ClassDef | None, ast.AST]]:
    """(enclosing class or None, function) for every function; a nested one carries the
    class of the method around it. The module itself comes first, as (None, module)."""
    yield None, tree

    def visit(node: ast.AST, cls: ast.ClassDef | None) -> Iterator[tuple[Any, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from visit(child, child)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield cls, child
                yield from visit(child, cls)
            else:
                yield from visit(child, cls)

    yield from visit(tree, None)


def own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``fn``'s own body: not those of the functions and classes in it."""
    for child in ast.iter_child_nodes(fn):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield child
            yield from own_nodes(child)


def attribute_uses(node: ast.AST) -> tuple[ast.expr, str, bool] | None:
    """(receiver, name, stored) for ``X.name`` and for getattr/setattr/hasattr/delattr
    with a literal name; None for anything else."""
    if isinstance(node, ast.Attribute):
        return node.value, node.attr, isinstance(node.ctx, (ast.Store, ast.Del))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return node.args[0], node.args[1].value, node.func.id in ("setattr", "delattr")
    return None


def is_self(receiver: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: an object's own attribute, whichever layer."""
    if isinstance(receiver, ast.Name):
        return receiver.id in ("self", "cls")
    return isinstance(receiver, ast.Call) and ast.unparse(receiver.func) == "super"


def class_members() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(methods, data): each name the package's classes define -> the modules defining
    it. Methods: the ``def``s in class bodies, properties left out. Data: the rest of a
    class body (class attributes, annotated fields, properties), and ``self.x``/``cls.x``
    assigned in a method."""
    methods: dict[str, set[str]] = {}
    data: dict[str, set[str]] = {}
    for module, path in package_modules().items():
        for cls, fn in functions_in(ast.parse(path.read_text())):
            if isinstance(fn, ast.Module):
                for node in ast.walk(fn):
                    for s in node.body if isinstance(node, ast.ClassDef) else []:
                        method = isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                        kind = methods if method and not is_property(s) else data
                        for name in _defined(s):
                            kind.setdefault(name, set()).add(module)
            elif cls is not None:
                for node in own_nodes(fn):
                    use = attribute_uses(node)
                    if use and use[2] and is_self(use[0]):
                        data.setdefault(use[1], set()).add(module)
    return methods, data


def private_names() -> dict[str, set[str]]:
    """Each private name the package's classes define -> the modules defining it."""
    out: dict[str, set[str]] = {}
    for kind in class_members():
        for name, modules in kind.items():
            if name.startswith("_") and not name.endswith("__"):
                out.setdefault(name, set()).update(modules)
    return out


def _defined(statement: ast.stmt) -> list[str]:
    """The names a class-body statement defines."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [statement.name]
    targets = getattr(statement, "targets", None) or [getattr(statement, "target", None)]
    flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
    return [t.id for t in flat if isinstance(t, ast.Name)]


def test_no_private_attribute_of_another_module_is_used() -> None:
    """``X._name`` (read, written, or by getattr/setattr) where ``X`` is not the object
    itself (``self``, ``cls``, ``super()``) and ``_name`` is ours, defined in another
    module: counted. Names the package does not define are a third party's
    (``torch._C``, ``os._exit``, a namedtuple's ``_replace``, the OTel SDK's
    ``_metric_readers``). In a module that defines ``_name`` too, a bare name as the
    receiver (``other._x``, ``Cls._x``) is that module's own object; one reached through
    another object (``self.source.recorder._lock``) is not, and is counted."""
    ours = private_names()
    assert "_lock" in ours and "_log" in ours, "no private names found: the scan is broken"
    found: list[str] = []
    for module, path in package_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            use = attribute_uses(node)
            if use is None or use[1] not in ours or is_self(use[0]):
                continue
            receiver, name, _ = use
            if module not in ours[name] or not isinstance(receiver, ast.Name):
                why = (
                    "another object's, through its attributes"
                    if module in ours[name]
                    else "defined in " + ", ".join(sorted(ours[name]))
                )
                found.append(
                    f"{path.relative_to(PKG.parent)}:{node.lineno} {ast.unparse(node)} ({why})"
                )
    found.sort()
    print(f"{len(found)} private attributes used outside their module", *found, sep="\n")
    assert not found, "use a public name (a property, a method) instead:\n" + "\n".join(found)


def is_property(fn: ast.stmt) -> bool:
    names = [ast.unparse(d) for d in getattr(fn, "decorator_list", [])]
    return any(n.endswith(("property", ".setter", ".deleter")) for n in names)


# Methods our classes define that are also a third party's, patched on the third party's
# objects: decided by the receiver. export/bridge.py patches the OTel SDK's
# MetricReader._receive_metrics on the application's readers, never on its own _Bridged
# ones (which override it).
THIRD_PARTY_METHODS = frozenset({"_receive_metrics"})


class Classes:
    """The package's classes, for what a receiver is: each class's methods (its own and
    its bases' within the package, properties left out) and its fields' declared types;
    and the names that are only ever methods of ours, never data."""

    def __init__(self) -> None:
        self.defs = {name: [c for _, c in found] for name, found in class_defs().items()}
        methods, data = class_members()
        self.only_methods = set(methods) - set(data)

    def methods(self, name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        out: set[str] = set()
        for node in self.defs.get(name, []):
            out |= {
                s.name
                for s in node.body
                if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and not is_property(s)
            }
            for base in node.bases:
                base_name = ast.unparse(base).rpartition(".")[2].partition("[")[0]
                if base_name not in seen | {name}:
                    out |= self.methods(base_name, seen | {name})
        return out

    def named(self, annotation: ast.expr | None) -> str | None:
        """The class of ours an annotation or a call names (``T``, ``T | None``, ``T()``)."""
        if annotation is None:
            return None
        if isinstance(annotation, ast.Call):
            annotation = annotation.func
        for part in ast.unparse(annotation).strip("'\"").split("|"):
            name = part.strip().rpartition(".")[2]
            if name in self.defs:
                return name
        return None

    def field(self, cls: ast.ClassDef, attr: str) -> str | None:
        """The class of ours ``self.attr`` holds, where ``cls`` declares it."""
        for node in ast.walk(cls):
            if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) in (
                attr,
                f"self.{attr}",
            ):
                return self.named(node.annotation)
            if isinstance(node, ast.Assign) and f"self.{attr}" in map(ast.unparse, node.targets):
                return self.named(node.value) if isinstance(node.value, ast.Call) else None
        return None

    def receiver(self, x: ast.expr, cls: ast.ClassDef | None, fn: ast.AST) -> str | None:
        """The class of ours ``x`` is (or an instance of), where the code says so: ``self``
        and ``cls``, a class's name, a parameter or local annotated or built as one, and
        ``self.field`` declared as one. None: unknown (a third party's, as a rule)."""
        if isinstance(x, ast.Name):
            if x.id in ("self", "cls"):
                return cls.name if cls is not None else None
            if x.id in self.defs:
                return x.id
            args = getattr(fn, "args", None)
            params = [*args.posonlyargs, *args.args, *args.kwonlyargs] if args else []
            for a in params:
                if a.arg == x.id:
                    return self.named(a.annotation)
            for node in own_nodes(fn):
                if isinstance(node, ast.Assign) and x.id in map(ast.unparse, node.targets):
                    return self.named(node.value) if isinstance(node.value, ast.Call) else None
            return None
        if isinstance(x, ast.Attribute) and ast.unparse(x.value) == "self" and cls is not None:
            return self.field(cls, x.attr)
        return None


def assigned_attributes(fn: ast.AST) -> Iterator[tuple[ast.AST, ast.expr, str]]:
    """(node, receiver, name) of each ``X.name = ...`` and ``setattr(X, "name", ...)``."""
    for node in own_nodes(fn):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for t in targets:
            for e in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(e, ast.Attribute):
                    yield node, e.value, e.attr
        use = attribute_uses(node) if isinstance(node, ast.Call) else None
        if use is not None and ast.unparse(node.func) == "setattr":  # type: ignore[attr-defined]
            yield node, use[0], use[1]


def test_no_method_is_replaced_on_an_instance() -> None:
    """``X.name = ...`` (or ``setattr``) where ``X`` is one of our classes or an instance
    of one and ``name`` is a method of that class: a method replaced, on the instance or
    for every instance. What the instance holds instead is a declared field. Where the
    code does not say what ``X`` is, ``name`` counts if it is only ever a method of ours,
    outside adapters/ (adapters wrap a third party's methods by design: ``GradScaler.step``,
    a loader iterator's ``__next__``, the user's ``model.forward``)."""
    classes = Classes()
    assert "transition" in classes.methods("Writer"), "no methods found: the scan is broken"
    found: list[str] = []
    for module, path in package_modules().items():
        for cls, fn in functions_in(ast.parse(path.read_text())):
            for node, receiver, name in assigned_attributes(fn):
                owner = classes.receiver(receiver, cls, fn)
                if owner is not None and name in classes.methods(owner):
                    what = f"replaces {owner}.{name}"
                elif owner is None and name in classes.only_methods - THIRD_PARTY_METHODS:
                    what = "replaces a method of ours"
                else:
                    continue
                if owner is None and part_of(module) == "adapters":
                    continue
                found.append(
                    f"{path.relative_to(PKG.parent)}:{node.lineno} "
                    f"{ast.unparse(receiver)}.{name} {what}"
                )
    found.sort()
    print(f"{len(found)} methods replaced on an instance or a class", *found, sep="\n")
    assert not found, "declare a field for what changes instead:\n" + "\n".join(found)
