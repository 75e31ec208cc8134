"""Check docs/conformance.md, the protocol conformance matrix (format: the matrix's own preamble).

Fails when a spec section has no heading or no row, a row names a test file or function that does
not exist, an id repeats or does not start with its section number, or a row has no evidence.
`docs/conformance-sections.txt` holds the spec's section list (the spec is kept outside the
repository); with a spec at hand, `--write-sections` regenerates it and a plain run also fails when
the list is stale.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = ROOT.parent / "shared" / "spec" / "realtime-protocol.md"
LANES = frozenset({"L", "G", "D", "N", "M", "—"})
EVIDENCE_PREFIXES = ("Deviation:", "Informative:")
NODE_ID = re.compile(r"`(tests/[\w/]+\.py)::([\w:]+)(?:\[[^`]*\])?`")
SPEC_HEADING = re.compile(r"^(#{2,4}) (?:Appendix )?([0-9A-Z]+(?:\.\d+)*)\.? (.+)$")
MATRIX_HEADING = re.compile(r"^## §([0-9A-Z]+(?:\.\d+)*) (.+)$")


@dataclass(frozen=True)
class Row:
    section: str
    id: str
    requirement: str
    lanes: str
    evidence: str
    line: int


def spec_sections(spec: str) -> list[str]:
    """`§N.M Title` for every `###`/`####` heading, and for each `##` heading without sub-headings."""
    headings: list[tuple[int, str]] = []
    fenced = False
    for line in spec.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := SPEC_HEADING.match(line)):
            headings.append((len(match[1]), f"§{match[2]} {match[3].strip()}"))
    return [title for index, (level, title) in enumerate(headings)
            if level > 2 or index + 1 == len(headings) or headings[index + 1][0] == 2]


def split_cells(line: str) -> list[str]:
    """Cells of a markdown table row; `\\|` inside a cell is not a separator."""
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def parse_matrix(text: str) -> tuple[dict[str, tuple[str, int]], list[Row]]:
    """Section headings (number -> (title, line)) and table rows of the matrix."""
    headings: dict[str, tuple[str, int]] = {}
    rows: list[Row] = []
    section = ""
    for number, line in enumerate(text.splitlines(), start=1):
        if match := MATRIX_HEADING.match(line):
            section = match[1]
            headings[section] = (match[2].strip(), number)
        elif section and line.startswith("|"):
            cells = split_cells(line)
            if cells[0] == "id" or set("".join(cells)) <= set("-: "):
                continue
            rows.append(Row(section, *(cells + [""] * 4)[:4], line=number))
    return headings, rows


@cache
def test_names(path: Path) -> frozenset[str]:
    """`func` and `Class::func` for each module-level or class-level (async) def of a test file."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(f"{node.name}::{item.name}" for item in node.body
                         if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef))
    return frozenset(names)


def row_problems(row: Row, root: Path) -> list[str]:
    where = f"line {row.line} ({row.id or 'no id'})"
    problems = []
    if not re.fullmatch(rf"{re.escape(row.section)}-\d+", row.id):
        problems.append(f"{where}: id must be '{row.section}-<n>'")
    if not row.requirement:
        problems.append(f"{where}: empty requirement")
    if not row.lanes or not set(row.lanes.split()) <= LANES:
        problems.append(f"{where}: lanes must be among {' '.join(sorted(LANES))}")
    node_ids = NODE_ID.findall(row.evidence)
    if not node_ids and not row.evidence.startswith(EVIDENCE_PREFIXES):
        problems.append(f"{where}: no evidence (a test node id, 'Deviation:' or 'Informative:')")
    for file, name in node_ids:
        path = root / file
        if not path.is_file():
            problems.append(f"{where}: no test file {file}")
        elif name not in test_names(path):
            problems.append(f"{where}: no test {file}::{name}")
    return problems


def selected(section: str, prefixes: list[str] | None) -> bool:
    return prefixes is None or any(section == p or section.startswith(f"{p}.") for p in prefixes)


def check(matrix: str, sections: list[str], root: Path, prefixes: list[str] | None = None) -> list[str]:
    """Every problem of the matrix text against the section list (restricted to `prefixes`)."""
    headings, rows = parse_matrix(matrix)
    wanted = {title.split(" ", 1)[0][1:]: title.split(" ", 1)[1] for title in sections}
    problems = [f"§{number}: no heading in the matrix" for number in wanted
                if selected(number, prefixes) and number not in headings]
    covered = {row.section for row in rows}
    for number, (title, line) in headings.items():
        if not selected(number, prefixes):
            continue
        if number not in wanted:
            problems.append(f"line {line}: §{number} is not a spec section")
        elif title != wanted[number]:
            problems.append(f"line {line}: §{number} title {title!r}, spec has {wanted[number]!r}")
        if number not in covered:
            problems.append(f"line {line}: §{number} has no row")
    seen: dict[str, int] = {}
    for row in rows:
        if not selected(row.section, prefixes):
            continue
        if row.id in seen:
            problems.append(f"line {row.line}: id {row.id} repeats line {seen[row.id]}")
        seen.setdefault(row.id, row.line)
        problems += row_problems(row, root)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", type=Path, default=ROOT / "docs" / "conformance.md")
    parser.add_argument("--sections-file", type=Path, default=ROOT / "docs" / "conformance-sections.txt")
    parser.add_argument("--spec", type=Path, default=DEFAULT_SPEC if DEFAULT_SPEC.is_file() else None)
    parser.add_argument("--root", type=Path, default=ROOT, help="directory the tests/ paths are relative to")
    parser.add_argument("--sections", nargs="+", metavar="N", help="check only these sections (e.g. 1 2.4)")
    parser.add_argument("--write-sections", action="store_true", help="regenerate --sections-file from --spec")
    args = parser.parse_args(argv)
    if args.write_sections:
        if args.spec is None:
            parser.error("--write-sections needs --spec")
        args.sections_file.write_text("\n".join(spec_sections(args.spec.read_text())) + "\n")
        return 0
    sections = args.sections_file.read_text().splitlines()
    problems = []
    if args.spec is not None and spec_sections(args.spec.read_text()) != sections:
        problems.append(f"{args.sections_file} differs from {args.spec}'s headings (run --write-sections)")
    problems += check(args.matrix.read_text(), sections, args.root, args.sections)
    for problem in problems:
        print(f"{args.matrix}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
