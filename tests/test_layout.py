"""Calls go downward only: cli -> model -> decoding -> engine -> formats (docs/architecture.md).

Read from the source's import statements, function-level ones included, so an import that climbs
back up (a decoder importing the Model, a kernel importing a decoder) fails here by name."""
import ast
import os

import tinydiff

ROOT = os.path.dirname(tinydiff.__file__)
BASE = {"errors"}
# each part of the package: the parts it may import
MAY_IMPORT = {
    "formats": {"formats"},
    "engine": {"engine", "formats", "_kernels"},
    "decoding": {"decoding", "engine", "formats"},
    "model": {"decoding", "engine", "formats"},
    "chat": {"decoding", "engine", "formats"},
    "serve": {"serve", "decoding", "engine", "formats"},
    "convert": {"engine", "formats", "requantize"},
    "requantize": {"formats"},
    "measure": {"measure", "model", "decoding", "engine", "formats", "_kernels"},
    "training": {"training", "measure", "model", "decoding", "engine", "formats"},
    "cli": {"cli", "model", "chat", "serve", "convert", "measure", "training", "decoding", "engine", "formats",
            "__version__"},
    "__init__": {"model", "chat", "engine", "formats"},
    "__main__": {"cli"},
}


def part(module):
    """'tinydiff.engine.kernels' -> 'engine'; 'tinydiff.model' -> 'model'."""
    return module.split(".")[1]


def imports():
    """(importing module, imported module) for every relative import in the package."""
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
            package = rel.split(".")[:-1]
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                if isinstance(node, ast.ImportFrom) and node.level:
                    base = package[:len(package) - node.level + 1]
                    if node.module:
                        yield rel, ".".join(base + [node.module])
                    else:
                        yield from ((rel, ".".join(base + [a.name])) for a in node.names)
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                    assert not any(n == "tinydiff" or n.startswith("tinydiff.") for n in names), \
                        f"{rel}: import tinydiff relatively"


def test_every_import_goes_down():
    seen = 0
    for src, dst in imports():
        if len(dst.split(".")) < 2:
            continue
        seen += 1
        a, b = part(src), part(dst)
        assert b in MAY_IMPORT[a] | BASE, f"{src} imports {dst}: {a} may import only {sorted(MAY_IMPORT[a])}"
    assert seen > 50

