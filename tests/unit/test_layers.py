"""The package's imports run one way: down the layers the README's "Architecture" draws, with no
circle. Every import counts, those inside functions too (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "queryserve"

# Lowest first: a module may import its own layer and the ones below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("api", "errors", "types", "progress", "arguments", "heap", "__init__"),
    ("config",),
    ("backends",),
    ("scheduling",),
    ("model",),
    ("pipelines",),
    ("repository",),
    ("server", "local"),
    ("cli", "__main__", "prepare", "optimize", "bench", "spell", "intent", "duplicates",
     "training", "indexing"),
)


def _top(module: str) -> str:
    return module.split(".")[1] if "." in module else "__init__"


def layer(module: str) -> int:
    top = _top(module)
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    raise AssertionError(f"{module}: its top-level name {top!r} is in no layer; add it")


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The package's modules that `path` imports (a name imported from a package counts as
    that submodule when it is one)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [f"{node.module}.{alias.name}" for alias in node.names]
            targets = [t if t in known else node.module for t in targets]
        else:
            continue
        yield from (t for t in targets if t.startswith("queryserve"))


def test_no_import_runs_up_the_layers() -> None:
    known = modules()
    upward = [f"{name} -> {target}" for name, path in sorted(known.items())
              for target in imports(path, known) if layer(target) > layer(name)]
    assert upward == []


def test_no_import_circle() -> None:
    known = modules()
    graph = {name: {t for t in imports(path, known) if t in known and t != name}
             for name, path in known.items()}
    # A package's __init__ importing its own submodules is how a package is built, not a loop.
    for name in graph:
        graph[name] = {t for t in graph[name]
                       if not (t.startswith(name + ".") and known[name].name == "__init__.py")}
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> None:
        if node in path:
            raise AssertionError("import circle: " + " -> ".join(
                [*path[path.index(node):], node]))
        if node in done:
            return
        path.append(node)
        for target in sorted(graph[node]):
            visit(target)
        path.pop()
        done.add(node)

    for name in sorted(graph):
        visit(name)


TOOLS = LAYERS[-1]
ENGINE = ("repository", "scheduling", "model", "server")
"""What runs a model: the tools reach it only through `local.open_model` (the batch job, the
index build, the evaluations), never by building or scheduling a model of their own. They
do share the model's own file formats with the runtime (`pipelines/pairs/features.py`,
`head.py`, the noisy channel's noise model): training and serving must read them alike."""


def test_the_tools_run_models_only_through_local() -> None:
    known = modules()
    reached = [f"{name} -> {target}" for name, path in sorted(known.items())
               if _top(name) in TOOLS and name != "queryserve.cli"  # cli starts the server
               for target in imports(path, known)
               if _top(target) in ENGINE
               and not target.startswith("queryserve.server.grpc.proto")]  # bench's messages
    assert reached == []


def test_the_front_ends_infer_only_through_the_servers_one_door() -> None:
    """Every route infers through `ServerState.infer` (directly, or through the KServe
    operations that call it), where the item limit is checked: a route that called
    `model.infer` itself would skip the limit."""
    server = PACKAGE / "server"
    callers = []
    for path in sorted(server.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            for call in re.finditer(r"([\w.]+)\.infer\(", code):
                if call.group(1) not in ("self.state", "state", "self.service"):
                    callers.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert [c for c in callers if not c.startswith("server/state.py")] == []
