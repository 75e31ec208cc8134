"""Structure rules `make lint` enforces beyond ruff and import-linter: no import circles
between the package's modules, and no module over MAX_LINES lines."""

from __future__ import annotations

import sys
from pathlib import Path

import grimp

PACKAGE = "vllm_omni"
MAX_LINES = 400


def import_circles(package: str) -> list[tuple[str, str]]:
    """Direct imports a -> b where b also reaches a (function-level imports included)."""
    graph = grimp.build_graph(package)
    return sorted((a, b) for a in graph.modules for b in graph.find_modules_directly_imported_by(a)
                  if b.startswith(package) and graph.chain_exists(importer=b, imported=a))


def long_modules(root: Path) -> list[tuple[Path, int]]:
    sizes = ((path, len(path.read_text().splitlines())) for path in sorted(root.rglob("*.py")))
    return [(path, lines) for path, lines in sizes if lines > MAX_LINES]


def main() -> int:
    problems = [f"import circle: {a} imports {b}, which imports it back" for a, b in import_circles(PACKAGE)]
    problems += [f"{path}: {lines} lines (at most {MAX_LINES})" for path, lines in long_modules(Path(PACKAGE))]
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
