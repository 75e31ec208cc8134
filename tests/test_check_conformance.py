"""scripts/check_conformance.py: the matrix lint `make lint` runs (docs/conformance.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "check_conformance.py"
SPEC = """# Title
## 1. Connection
### 1.1 Endpoint
text
```
### not a heading
```
#### 1.1.1 Sub `x`
## 2. Errors
## Appendix A. Traces
### A.1 Trace one
"""
GOOD = """# Matrix
## §1.1 Endpoint

| id | Requirement | Lanes | Evidence |
| --- | --- | --- | --- |
| 1.1-1 | One `a \\| b` per frame | G D | `tests/test_x.py::test_one` |
| 1.1-2 | Other | — | `tests/test_x.py::TestThing::test_two[param-1]` |

## §1.1.1 Sub `x`

| id | Requirement | Lanes | Evidence |
| --- | --- | --- | --- |
| 1.1.1-1 | Deviates | L | Deviation: a reason |

## §2 Errors

| id | Requirement | Lanes | Evidence |
| --- | --- | --- | --- |
| 2-1 | async | N | `tests/test_x.py::test_async` |

## §A.1 Trace one

| id | Requirement | Lanes | Evidence |
| --- | --- | --- | --- |
| A.1-1 | Editorial | — | Informative: nothing to test |
"""
TESTS = """
def test_one(): pass
async def test_async(): pass
class TestThing:
    def test_two(self): pass
"""


@pytest.fixture(scope="module")
def checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_conformance", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(TESTS)
    (tmp_path / "spec.md").write_text(SPEC)
    (tmp_path / "matrix.md").write_text(GOOD)
    return tmp_path


def run(checker: ModuleType, repo: Path, matrix: str, *extra: str) -> int:
    (repo / "matrix.md").write_text(matrix)
    return checker.main(["--matrix", str(repo / "matrix.md"), "--sections-file", str(repo / "sections.txt"),
                         "--spec", str(repo / "spec.md"), "--root", str(repo), *extra])


def test_sections_come_from_the_spec_headings(checker: ModuleType, repo: Path) -> None:
    assert run(checker, repo, GOOD, "--write-sections") == 0
    assert (repo / "sections.txt").read_text().splitlines() == [
        "§1.1 Endpoint", "§1.1.1 Sub `x`", "§2 Errors", "§A.1 Trace one"]


def test_good_matrix_passes(checker: ModuleType, repo: Path) -> None:
    run(checker, repo, GOOD, "--write-sections")
    assert run(checker, repo, GOOD) == 0


@pytest.mark.parametrize(("matrix", "message"), [
    (GOOD.replace("## §2 Errors", "## §2 Misnamed"), "title"),
    (GOOD.split("## §A.1")[0], "§A.1: no heading"),
    (GOOD.replace("| 2-1 | async | N | `tests/test_x.py::test_async` |\n", ""), "§2 has no row"),
    (GOOD.replace("test_x.py::test_one", "test_x.py::test_missing"), "no test tests/test_x.py::test_missing"),
    (GOOD.replace("test_x.py::test_one", "test_y.py::test_one"), "no test file tests/test_y.py"),
    (GOOD.replace("TestThing::test_two", "test_two"), "no test tests/test_x.py::test_two"),
    (GOOD.replace("| 1.1-2 |", "| 1.1-1 |"), "id 1.1-1 repeats"),
    (GOOD.replace("Deviation: a reason", "tested somewhere"), "no evidence"),
    (GOOD.replace("Deviation: a reason", ""), "no evidence"),
    (GOOD.replace("| 1.1-2 |", "| 1.2-2 |"), "id must be '1.1-<n>'"),
    (GOOD.replace("| G D |", "| X |"), "lanes"),
])
def test_bad_matrix_fails(checker: ModuleType, repo: Path, capsys: pytest.CaptureFixture[str],
                          matrix: str, message: str) -> None:
    run(checker, repo, GOOD, "--write-sections")
    assert run(checker, repo, matrix) == 1
    assert message in capsys.readouterr().err


def test_stale_section_list_fails(checker: ModuleType, repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(checker, repo, GOOD, "--write-sections")
    (repo / "spec.md").write_text(SPEC + "### A.2 Trace two\n")
    assert run(checker, repo, GOOD) == 1
    assert "run --write-sections" in capsys.readouterr().err


def test_sections_option_checks_one_half(checker: ModuleType, repo: Path) -> None:
    run(checker, repo, GOOD, "--write-sections")
    first_half = GOOD.split("## §2 Errors")[0]
    assert run(checker, repo, first_half) == 1
    assert run(checker, repo, first_half, "--sections", "1") == 0
