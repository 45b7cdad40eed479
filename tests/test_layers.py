"""Layers one way: tokenomy's parts import downward only, and no module imports itself around a cycle. A part is a
subpackage (api, engine, ledger ...) or a top-level module (gateway, generation ...); every import counts, those
inside functions and TYPE_CHECKING blocks too."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tokenomy"

# The parts from the bottom up: a part imports only parts in lower layers (a layer's parts never import each other).
LAYERS: list[set[str]] = [
    {"generation", "errors", "hardware"},   # the internal request, the one error type, the machine
    {"structured"},                         # grammars and token masks
    {"engine"},                             # the continuous-batching engine over llama.cpp
    {"models"},                             # packaged models, the hub, GGUF, geometry, memory fit
    {"config", "embedding", "metrics"},     # the YAML file; MiniLM; Prometheus families
    {"ledger", "context", "cache"},         # rows and their storage; token counts and compaction; response caches
    {"limits", "telemetry", "report"},      # keys, windows, budgets; traces; the report over ledger rows
    {"backends"},                           # where a generation runs
    {"router"},                             # which model
    {"pipeline"},                           # the stages over one request
    {"dialect"},                            # the APIs' bodies <-> the internal request
    {"batch"},                              # the Batch API's store and worker
    {"gateway"},                            # the composition root
    {"api"},                                # the HTTP app
    {"server"},                             # the process that serves it
    {"cli", "tools"},                       # the command, and the offline tools it runs
]
LAYER = {part: i for i, parts in enumerate(LAYERS) for part in parts}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports by absolute name, inside functions too."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def graph() -> dict[str, dict[str, list[str]]]:
    """part -> {imported part: [files that import it]}, tokenomy's own parts only."""
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent)
        part = _part(".".join(rel.with_suffix("").parts))
        for name in imported_modules(path):
            if name.split(".")[0] == "tokenomy" and "." in name and _part(name) != part:
                edges[part][_part(name)].append(str(rel))
    return edges


def test_the_graph_sees_the_package() -> None:
    g = graph()
    assert {"api", "batch", "engine", "ledger", "limits", "pipeline", "backends"} <= set(g)
    assert "gateway" in g["api"] and "pipeline" in g["batch"]      # an import the rules allow is seen


def test_every_part_has_a_layer() -> None:
    parts = {_part(".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)) for p in PACKAGE.rglob("*.py")}
    assert parts - {"__init__"} == set(LAYER)


def test_no_part_imports_what_lies_above_it() -> None:
    g = graph()
    found = {f"{part} -> {other}": files for part, to in g.items() for other, files in to.items()
             if LAYER[other] >= LAYER[part]}
    assert found == {}


def test_only_the_server_imports_the_http_app() -> None:
    g = graph()
    assert {part for part, to in g.items() if "api" in to} == {"server"}
    assert {part for part, to in g.items() if "server" in to} == {"cli"}


def test_no_import_cycle_between_parts() -> None:
    g = graph()

    def reaches(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in g.get(todo.pop(), {}):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    cycles = {f"{a} -> {b}": files for a in g for b, files in g[a].items() if a in reaches(b)}
    assert cycles == {}


def module_graph() -> dict[str, set[str]]:
    """module -> tokenomy modules it imports (inside functions and TYPE_CHECKING blocks too). `from pkg import mod`
    is an import of pkg.mod; `from pkg.mod import name` of pkg.mod alone."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path

    def owner(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    edges: dict[str, set[str]] = {m: set() for m in modules}
    for m, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                         for a in node.names]
            else:
                continue
            edges[m].update(owner(n) for n in names if n.split(".")[0] == "tokenomy" and owner(n) != m)
    return edges


def test_the_module_graph_sees_the_package() -> None:
    g = module_graph()
    assert "tokenomy.engine.spec.cost" in g["tokenomy.engine.spec.draft"]          # from pkg.mod import name
    assert "tokenomy.telemetry.trace" in g["tokenomy.gateway"]


def test_no_import_cycle_between_modules() -> None:
    """Tarjan's strongly connected components of the module graph: each must be one module."""
    g = module_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                cycles.append(sorted([v, *component]))

    for v in g:
        if v not in index:
            visit(v)
    assert cycles == []


def test_no_two_modules_or_classes_share_a_name_for_two_things() -> None:
    """A module's file name and a class's name each mean one thing across the package. Shared on purpose: an API's
    name by its HTTP routes and its bodies (api/messages.py serves dialect/messages.py), and the roles `command.py`
    (a package's `tokenomy ...` command) and `report.py` (a tool's printed report); and config/'s sections, each
    named after what it configures (config/routes.py is the file's `routes:`)."""
    same_api = {"messages.py", "responses.py", "embeddings.py", "conversations.py", "ollama.py", "command.py",
                "report.py"}
    files: dict[str, list[str]] = defaultdict(list)
    classes: dict[str, list[str]] = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE.parent))
        if not path.name.startswith("__") and path.parent.name != "config":
            files[path.name].append(rel)
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                classes[node.name].append(rel)
    twice = {name: where for name, where in files.items() if len(where) > 1 and name not in same_api}
    assert twice == {}
    assert {name: where for name, where in classes.items() if len(where) > 1} == {}


def test_every_prometheus_metric_is_defined_in_metrics() -> None:
    """tokenomy's families in metrics/prometheus.py; the engines' families in vLLM's names beside it, which
    prometheus.py registers (metrics/vllm.py)."""
    users = sorted(str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py")
                   if any(n.split(".")[0] == "prometheus_client" for n in imported_modules(p)))
    assert users == ["tokenomy/metrics/prometheus.py", "tokenomy/metrics/vllm.py"]
