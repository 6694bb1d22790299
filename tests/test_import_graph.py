"""The import graph of the packages, read from the source (every import statement, at module level or inside a
function): the layers hold, nothing imports a task but through the registry, and there is no import circle.

Layers: ``search_spaces`` < ``supernet`` < ``latency`` < ``tasks`` < ``nas`` < ``scripts``: lower never imports
higher.  ``tasks`` (one folder each) is reached by the layers only through :mod:`search_spaces.tasks`, the registry
that loads it through its entry point; a task may use another task's shared parts (``tasks.stack``).  In ``nas/`` the
commands parse flags and call library workflows: no library module imports ``nas.commands`` or ``nas.cli``, none
takes an ``argparse`` namespace, and the search library (``nas.search``) imports no workflow module.
"""

import ast

from tests.conftest import ROOT

PACKAGES = ("search_spaces", "supernet", "latency", "tasks", "nas")
LAYER = {"search_spaces": 0, "supernet": 1, "latency": 2, "tasks": 3, "nas": 4}
WORKFLOWS = ("nas.export", "nas.train_subnet", "nas.train_supernet", "nas.demo", "nas.classify", "nas.report")


def modules() -> dict[str, object]:
    """Every module of the packages: dotted name -> path."""
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path, known: dict) -> set[str]:
    """The modules of ours that ``name`` (at ``path``) imports, each import statement resolved to the module it loads
    (``from pkg import sub`` is the module ``pkg.sub`` where that is one, else ``pkg``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            targets = [(base, a.name) for a in node.names]
        else:
            continue
        for module, item in targets:
            if item is not None and f"{module}.{item}" in known:
                out.add(f"{module}.{item}")
            elif module in known:
                out.add(module)
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def command_modules() -> set[str]:
    """The modules that parse flags: nas.cli, the program's entry points (nas.entry, nas.__main__), nas.commands.*, the
    tasks' own commands, and the latency bundle's runner (its own program, run on a board)."""
    from search_spaces.tasks import tasks

    own = {m for t in tasks().values() for m in t.commands} | {"latency.devices.bundle_main"}
    return {n for n in modules() if n in ("nas.cli", "nas.entry", "nas.__main__") or n.startswith("nas.commands")} | own


def test_no_import_circle():
    assert cycles(graph()) == []


def test_the_layers_hold_and_only_the_registry_reaches_a_task():
    wrong = []
    for name, targets in graph().items():
        mine = LAYER[name.split(".")[0]]
        for t in targets:
            theirs = LAYER[t.split(".")[0]]
            if theirs > mine or (theirs == LAYER["tasks"] and mine != theirs):
                wrong.append(f"{name} -> {t}")
    assert wrong == []


def test_no_task_imports_nas_and_the_scripts_are_imported_by_nothing():
    """The direction of calls: a task never calls back up into the workflows (``grep "^\\s*(from|import) nas" tasks/``
    finds nothing, function-level imports included); nothing of the packages imports a benchmark script."""
    up = sorted(f"{n} -> {t}" for n, ts in graph().items() if n.startswith("tasks") for t in ts if t.startswith("nas"))
    assert up == []
    import re

    lines = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "tasks").rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if re.match(r"^\s*(from|import) nas\b", line)]
    assert lines == []
    scripts = {p.stem for p in (ROOT / "scripts").glob("*.py")}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            text = path.read_text()
            assert not re.search(rf"^\s*(from|import) (scripts\b|({'|'.join(scripts)})\b)", text, re.M), path


def test_the_search_library_and_every_workflow_stay_below_the_commands():
    cli = command_modules()
    reaching = sorted(f"{n} -> {t}" for n, ts in graph().items() if n not in cli for t in ts if t in cli)
    assert reaching == []
    search = sorted(f"{n} -> {t}" for n, ts in graph().items() if n.startswith("nas.search") for t in ts
                    if t.startswith("nas.commands") or t in ("nas.cli", *WORKFLOWS))
    assert search == []


def test_no_library_module_takes_an_argparse_namespace():
    cli, found = command_modules(), []
    for name, path in modules().items():
        if name not in cli and ("argparse" in path.read_text()):
            found.append(name)
    assert found == []


def test_the_graph_is_read_right():
    """The reader sees a function's lazy import and resolves relative ones (the test would pass on an empty graph)."""
    g = graph()
    assert "supernet.checkpoint" in g["supernet.train"]  # from .checkpoint import ... (module level)
    assert "search_spaces.tasks" in g["supernet.checkpoint"]  # from search_spaces import ..., tasks (a submodule)
    assert "nas.train_supernet" in g["nas.commands.train_supernet"]  # inside run()
    assert "tasks.stack.export" in g["tasks.stack"]  # from .export import ... (a package's relative import)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
