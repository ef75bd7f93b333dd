"""No module imports a layer above its own.

Layers, bottom to top (a module may import its own layer and the layers below):

0. the core: ``kernelfleet.chips`` (chip identity: this machine; the table of known chips) and
   ``kernelfleet.local_state`` (this machine's data directory and local mode's admin token),
   ``kernelfleet.runtime_settings_file`` (MLX's runtime settings per chip, read before MLX starts) and
   ``kernelfleet.console`` (the CLI's output console);
1. ``kernelfleet.kernels``: the kernels, themselves layered:
   ``spec``, ``common`` < ``render``, ``zmlx`` < ``catalog`` < ``patch``, ``testing`` < the package
   itself and ``api`` (the public functions);
2. ``kernelfleet.worker``;
3. the coordinator: ``kernelfleet.service``, ``kernelfleet.web`` and ``kernelfleet.migrations`` side
   by side (the app mounts web's router, web reads service's models, migrations read the models and
   the service runs them);
4. the public top: ``kernelfleet`` itself (``kernelfleet.patch`` / ``unpatch``) and ``kernelfleet.zmlx``.

Every ``import x`` and ``from x import y`` counts, at module level or inside a function (a lazy
import is still an arrow), relative imports resolved; ``from pkg import name`` where ``name`` is a
submodule counts as importing the submodule. Imports by name (``importlib.import_module``) are not
seen.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# source folder -> the package it installs as (pyproject.toml's package-dir)
FOLDERS = {
    "kernelfleet": "kernelfleet",
    "kernels": "kernelfleet.kernels",
    "worker": "kernelfleet.worker",
    "service": "kernelfleet.service",
    "web": "kernelfleet.web",
    "migrations": "kernelfleet.migrations",
}
K = "kernelfleet.kernels"
# (rank, name, modules): a module's layer is the entry with its longest matching prefix; an entry
# ending in "=" matches that module exactly
LAYERS: tuple[tuple[float, str, tuple[str, ...]], ...] = (
    (0, "core", ("kernelfleet.chips", "kernelfleet.local_state", "kernelfleet.runtime_settings_file",
                 "kernelfleet.console")),
    (1.0, "kernels: spec and common", (f"{K}.spec", f"{K}.common")),
    (1.1, "kernels: render", (f"{K}.render",)),
    (1.1, "kernels: zmlx", (f"{K}.zmlx",)),
    (1.2, "kernels: catalog", (f"{K}.catalog",)),
    (1.3, "kernels: patch", (f"{K}.patch",)),
    (1.3, "kernels: testing", (f"{K}.testing",)),
    (1.4, "kernels: public functions", (f"{K}=", f"{K}.api")),
    (2, "worker", ("kernelfleet.worker",)),
    (3, "coordinator", ("kernelfleet.service", "kernelfleet.web", "kernelfleet.migrations")),
    (4, "public top", ("kernelfleet=", "kernelfleet.zmlx")),
)
# Upward arrows still there, each with why; the test fails when one of these goes away too, so the
# list only shrinks.
KNOWN: dict[tuple[str, str], str] = {}


def layer(module: str) -> tuple[float, str] | None:
    best: tuple[int, float, str] | None = None
    for rank, name, prefixes in LAYERS:
        for prefix in prefixes:
            exact = prefix.endswith("=")
            p = prefix.rstrip("=")
            matches = module == p or (not exact and module.startswith(p + "."))
            if matches and (best is None or len(p) > best[0]):
                best = (len(p), rank, name)
    return None if best is None else (best[1], best[2])


def module_name(path: Path) -> tuple[str, bool]:
    """(dotted module name, is a package __init__) of a source file."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [FOLDERS[rel.parts[0]], *rel.parts[1:]]
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def sources() -> dict[str, Path]:
    out = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            out[module_name(path)[0]] = path
    return out


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    where: str


def imports(path: Path, known: set[str], text: str | None = None) -> list[Edge]:
    """Every kernelfleet module ``path`` imports (or ``text``, as if it were that file's), anywhere in
    the file."""
    name, is_package = module_name(path)
    package = name if is_package else name.rpartition(".")[0]
    edges = []
    for node in ast.walk(ast.parse(path.read_text() if text is None else text, str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
        edges += [Edge(name, t, where) for t in targets if t == "kernelfleet" or t.startswith("kernelfleet.")]
    return edges


def upward(edges: list[Edge]) -> list[tuple[Edge, str]]:
    out = []
    for e in edges:
        a, b = layer(e.importer), layer(e.imported)
        assert a is not None, f"{e.importer} ({e.where}) is in no layer: add it to LAYERS"
        assert b is not None, f"{e.imported} ({e.where}) is in no layer: add it to LAYERS"
        if b[0] > a[0]:
            out.append((e, f"{e.where}: {e.importer} ({a[1]}) imports {e.imported} ({b[1]}), a layer above"))
    return out


def all_edges() -> list[Edge]:
    src = sources()
    return [e for path in src.values() for e in imports(path, set(src))]


def test_no_module_imports_a_layer_above_its_own() -> None:
    found = upward(all_edges())
    unknown = [msg for e, msg in found if (e.importer, e.imported) not in KNOWN]
    assert not unknown, "upward imports:\n" + "\n".join(unknown)
    gone = set(KNOWN) - {(e.importer, e.imported) for e, _ in found}
    assert not gone, f"these upward imports are gone: remove them from KNOWN: {sorted(gone)}"


def test_every_module_has_a_layer() -> None:
    missing = [m for m in sources() if layer(m) is None]
    assert not missing, missing


def test_the_check_sees_lazy_relative_and_submodule_imports() -> None:
    """The parser finds imports inside functions, resolves relative ones, and reports them upward."""
    path = ROOT / "kernels" / "render" / "launch.py"
    text = path.read_text() + (
        "\n\ndef _late():\n    from ..catalog import rowwise\n    from kernelfleet import worker\n"
        "    import kernelfleet.service.chips\n")
    messages = [msg for _, msg in upward(imports(path, set(sources()), text))]
    for imported in ("kernelfleet.kernels.catalog.rowwise", "kernelfleet.worker",
                     "kernelfleet.service.chips"):
        assert any(f"imports {imported} " in m for m in messages), (imported, messages)
