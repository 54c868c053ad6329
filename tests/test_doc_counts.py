"""What the docs count, counted in the code: alerts, printer columns, conditions and their reasons, the core
modules and packages of the module map, the generators.

Each figure comes from the code (the alert generator, the CRD, the condition and error classes, the source tree,
operator/tools/generate.py), so the test stays right as the code grows, and fails where a doc still says what
the code no longer has. A count written in words or digits anywhere in the docs ("five alerts", "3 generators")
is checked too: the docs state a count only where this test reads it.
"""
from __future__ import annotations

import importlib
import pkgutil
import re
import runpy
import sys
from pathlib import Path

import pytest
import yaml
from spillway.controller import conditions
from spillway.core.errors import SpillwayError
from spillway.observability import alerts as alert_rules

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted([REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "bench" / "README.md",
               *(REPO / "docs").glob("*.md")])
CRD = REPO / "charts" / "spillway" / "crds" / "modelservers.spillway.dev.yaml"
CORE = REPO / "operator" / "spillway" / "core"
PACKAGE = REPO / "operator" / "spillway"

WORDS = {w: n for n, w in enumerate(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"])}
NUMBER = r"(\d+|" + "|".join(WORDS) + r")"


def section(text: str, heading: str) -> str:
    """The text under a markdown heading, up to the next heading of the same or a higher level."""
    match = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, re.MULTILINE)
    assert match, f"no heading {heading!r}"
    level = len(match.group(1))
    end = re.compile(rf"^#{{1,{level}}} ", re.MULTILINE).search(text, match.end())
    return text[match.end():end.start() if end else len(text)]


def table_column(text: str, column: int) -> list[str]:
    """One column of the markdown tables in `text`, header and separator rows left out."""
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("|")]
    cells = [row[column].strip() for row in rows if len(row) > column]
    return [c for c in cells if c and not set(c) <= set("-: ")][1:] if cells else []


def claims(noun: str) -> list[tuple[str, int, int]]:
    """(doc, line, stated count) for each "<count> <noun>" in the docs."""
    pattern = re.compile(rf"\b{NUMBER}\s+{noun}\b", re.IGNORECASE)
    found = []
    for doc in DOCS:
        for lineno, line in enumerate(doc.read_text().splitlines(), 1):
            for match in pattern.finditer(line):
                word = match.group(1).lower()
                found.append((str(doc.relative_to(REPO)), lineno, int(word) if word.isdigit() else WORDS[word]))
    return found


def assert_claims(noun: str, actual: int, what: str) -> None:
    wrong = [f"{doc}:{line} says {stated}" for doc, line, stated in claims(noun) if stated != actual]
    assert not wrong, f"the code has {actual} {what}: " + "; ".join(wrong)


# -- alerts -----------------------------------------------------------------------------------------------------

ALERTS = [a.name for a in alert_rules.alerts()]


def test_every_alert_has_its_row_and_runbook_in_metrics_md():
    text = section((REPO / "docs" / "metrics.md").read_text(), "Alerts")
    rows = [cell.strip("`") for cell in table_column(text, 0)]
    runbooks = re.findall(r"^### (\S+)\s*$", text, re.MULTILINE)
    assert sorted(rows) == sorted(ALERTS), "docs/metrics.md's alert table"
    assert sorted(runbooks) == sorted(ALERTS), "docs/metrics.md's runbook sections"


def test_alert_counts_in_the_docs():
    assert_claims(r"(?:\w+\s+)?alerts?", len(ALERTS), "alerts")


# -- printer columns ----------------------------------------------------------------------------------------------

def printer_columns() -> list[dict]:
    crd = yaml.safe_load(CRD.read_text())
    served = [v for v in crd["spec"]["versions"] if v.get("served")]
    assert len(served) == 1, "one served version"
    return served[0]["additionalPrinterColumns"]


def test_kubectl_get_shows_the_crds_columns():
    columns = printer_columns()
    default = ["NAME", *(c["name"].upper() for c in columns if not c.get("priority"))]
    wide = [c["name"] for c in columns if c.get("priority")]
    modelserver = (REPO / "docs" / "modelserver.md").read_text()
    header = re.search(r"^\$ kubectl get ms\n(NAME .*)$", modelserver, re.MULTILINE)
    assert header, "docs/modelserver.md shows `kubectl get ms` and its header line"
    assert re.split(r"\s{2,}", header.group(1).strip()) == default, "docs/modelserver.md's `kubectl get ms` header"
    readme = re.search(r"kubectl get ms -A -w\s+# (.*)$", (REPO / "README.md").read_text(), re.MULTILINE)
    assert readme and re.split(r"\s{2,}", readme.group(1).strip()) == default[1:], "README.md's `kubectl get ms` line"
    wide_text = re.search(r"`kubectl get ms -o wide` adds ([^.]*)\.", modelserver)
    assert wide_text, "docs/modelserver.md says what -o wide adds"
    assert all(name.lower() in wide_text.group(1).lower() for name in wide), (wide, wide_text.group(1))
    assert_claims(r"(?:printer\s+)?columns(?= of `kubectl)", len(default) - 1, "printer columns")


# -- conditions and their reasons ---------------------------------------------------------------------------------

def error_reasons() -> set[str]:
    """The reason of every SpillwayError the operator's modules define: what a Planned/Degraded condition says."""
    for package in ("spillway.core", "spillway.controller"):
        for module in pkgutil.iter_modules(importlib.import_module(package).__path__):
            importlib.import_module(f"{package}.{module.name}")
    found, todo = set(), [SpillwayError]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        # Only the operator's own classes: the CLIs' errors (loadtest, qualify) are subclasses too once another
        # test imported them, which made the count depend on the suite's order.
        if cls is not SpillwayError and cls.__module__.startswith(("spillway.core.", "spillway.controller.")):
            found.add(cls.reason)
    return found


def test_conditions_and_reasons_in_modelserver_md():
    text = (REPO / "docs" / "modelserver.md").read_text()
    row = re.search(r"^\| `conditions\[\]` \| (.*)$", text, re.MULTILINE)
    assert row, "docs/modelserver.md's status table has conditions[]"
    assert re.findall(r"`(\w+)`", row.group(1).split("(")[0]) == list(conditions.ORDER)
    table = text[text.index("Condition reasons:"):]
    table = table[:table.index("\n\n", table.index("| condition |"))]
    documented = {r for cell in table_column(table, 1) for r in re.findall(r"`(\w+)`", cell)}
    written = error_reasons() | {v for k, v in vars(conditions).items() if k.startswith("REASON_")}
    assert sorted(written - documented) == [], "reasons the operator writes that the table leaves out"
    assert sorted(documented - written) == [], "reasons in the table that nothing writes"
    readme = re.search(r"reports (`\w+`(?:/`\w+`)*) conditions", (REPO / "README.md").read_text())
    assert readme and re.findall(r"`(\w+)`", readme.group(1)) == list(conditions.ORDER), "README.md's conditions"
    assert_claims(r"(?:status\s+)?conditions", len(conditions.ORDER), "conditions")


# -- the module map -------------------------------------------------------------------------------------------------

def module_map() -> str:
    text = (REPO / "docs" / "architecture.md").read_text()
    start = text.index("```\noperator/spillway/\n")
    return text[start:text.index("```", start + 4)]


def named(module: str, text: str) -> bool:
    """`module` (a file name) appears in the map, or a glob the map writes for it (`routing_*.py`)."""
    words = set(re.findall(r"[\w*]+\.py|[\w*]+/", text))
    return any(Path(module).match(w) or module == w for w in words)


def test_the_module_map_names_every_core_module_and_package():
    text = module_map()
    core = sorted(p.name for p in CORE.glob("*.py") if p.name != "__init__.py")
    missing = [m for m in core if not named(m, text)]
    assert not missing, f"core modules docs/architecture.md's module map does not name: {missing}"
    packages = sorted(p.name + "/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    missing = [p for p in packages if not named(p, text)]
    assert not missing, f"packages of operator/spillway the module map does not name: {missing}"
    assert_claims(r"core\s+modules", len(core), "core modules")


# -- generators -----------------------------------------------------------------------------------------------------

def test_every_generator_is_in_the_generators_table():
    generators = runpy.run_path(str(REPO / "operator" / "tools" / "generate.py"))["GENERATORS"]
    text = section((REPO / "docs" / "architecture.md").read_text(), "Generators")
    rows = table_column(text, 0)
    assert len(rows) == len(generators), (rows, [g.name for g in generators])
    for generator in generators:
        source = generator.source.rstrip("/")
        short = source.removeprefix("operator/").replace("/", ".")
        assert any(source in row or short in row for row in rows), f"{generator.source} has no row"
    assert_claims(r"generators", len(generators), "generators")


@pytest.mark.parametrize("noun, text, count", [
    (r"(?:\w+\s+)?alerts?", "it ships five alerts with runbooks", 5),
    (r"generators", "the 3 generators", 3),
])
def test_a_stated_count_is_read(noun, text, count, monkeypatch, tmp_path):
    """The claim reader itself: a sentence with a count is found, and its number read, in words or digits."""
    doc = tmp_path / "doc.md"
    doc.write_text(text + "\n")
    monkeypatch.setattr(sys.modules[__name__], "DOCS", [doc])
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert [c[2] for c in claims(noun)] == [count]
