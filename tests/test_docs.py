"""The README and docs/ stay true to the repository: links resolve, every WEFT_* variable the code
reads is documented (and nothing else), the README stays short, and its Python snippets are
examples that run (test_examples.py runs them). Each check is also shown failing on a made-up
tree, so none of them passes by finding nothing."""

from __future__ import annotations

from pathlib import Path

import doc_checks
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
EXAMPLES = sorted((ROOT / "examples").rglob("*.py"))
README_MAX_LINES = 250


def source_files() -> list[Path]:
    code = [p for p in (ROOT / "csrc").rglob("*") if p.suffix in (".cc", ".h", ".cu")]
    return code + sorted((ROOT / "python" / "weft").rglob("*.py")) + [ROOT / "CMakeLists.txt"]


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, at most {README_MAX_LINES}: move depth to docs/"
    )


def test_docs_pages_exist():
    names = {p.name for p in DOCS}
    expected = {"backend.md", "core-api.md", "ddp.md", "benchmark.md", "performance.md"}
    expected |= {"algorithms.md", "gpu.md", "environment.md", "design.md", "topo.md"}
    assert expected <= names, f"missing: {sorted(expected - names)}"


def test_every_relative_link_resolves():
    problems = doc_checks.broken_links([README, *DOCS], ROOT)
    assert not problems, "\n".join(problems)


def test_every_variable_read_is_documented_and_every_documented_one_is_read():
    sources = source_files()
    read = doc_checks.variables_read(sources)
    assert {"WEFT_TRANSPORT", "WEFT_ALGO", "WEFT_CUDA"} <= read, read  # the scan finds them
    problems = doc_checks.environment_mismatches(ROOT / "docs" / "environment.md", sources)
    assert not problems, "\n".join(problems)


def test_every_readme_python_snippet_lives_in_an_example():
    found, problems = doc_checks.snippet_sources(README, EXAMPLES)
    assert not problems, "\n".join(problems)
    assert found, "the README shows no Python: a newcomer needs a snippet per entry point"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_names_its_command(example):
    if example.name == "train_digits.py":
        pytest.skip("its docstring gives two commands; test_ddp.py runs it")
    doc_checks.example_command(example, example.relative_to(ROOT).as_posix())


# ---- the checks fail where they must -----------------------------------------------------------


def test_a_missing_file_or_anchor_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Second part\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md) [anchor](docs/a.md#second-part) [web](https://example.org/x)\n"
        "![plot](bench/gone.png) [bad anchor](docs/a.md#third) [out](../../etc/passwd)\n"
        "`[in code](nowhere.md)`\n```\n[in a block](nowhere.md)\n```\n"
    )
    problems = doc_checks.broken_links([page], tmp_path)
    assert len(problems) == 3, problems
    assert "bench/gone.png: no such file" in problems[0]
    assert "no heading with that anchor" in problems[1]
    assert "outside the repository" in problems[2]


def test_undocumented_and_stale_variables_are_reported(tmp_path):
    config = tmp_path / "config.cc"
    config.write_text('c.a = env_long("WEFT_READ_ONLY", 1);\nc.b = env("WEFT_BOTH");\n')
    script = tmp_path / "cli.py"
    script.write_text('os.environ.get("WEFT_FROM_PYTHON")\nenv["WEFT_SET_NOT_READ"] = "1"\n')
    page = tmp_path / "environment.md"
    page.write_text(
        "| variable | meaning |\n|---|---|\n| `WEFT_BOTH=a\\|b` | see `WEFT_READ_ONLY` |\n"
        "| `WEFT_FROM_PYTHON` | x |\n| `WEFT_GONE` | y |\n"
    )
    problems = doc_checks.environment_mismatches(page, [config, script])
    assert problems == [
        "WEFT_READ_ONLY is read but not documented in environment.md",
        "WEFT_GONE is documented in environment.md but nothing reads it",
    ]


def test_a_snippet_that_drifted_from_its_example_is_reported(tmp_path):
    example = tmp_path / "use.py"
    example.write_text('"""Use: python examples/use.py"""\nimport weft\n\nweft.algorithms("x")\n')
    readme = tmp_path / "README.md"
    readme.write_text(
        '```python\nimport weft\n\nweft.algorithms("x")\n```\n'
        '```python\nimport weft\nweft.algorithms("x")\n```\n```sh\nnot python\n```\n'
    )
    found, problems = doc_checks.snippet_sources(readme, [example])
    assert found == {2: example}
    assert len(problems) == 1 and problems[0].startswith("README.md:7:"), problems
    assert doc_checks.example_command(example, "examples/use.py") == ["python", "examples/use.py"]
    with pytest.raises(ValueError, match="first line"):
        doc_checks.example_command(example, "examples/topo/use.py")
    example.write_text('"""No command here."""\n')
    with pytest.raises(ValueError, match="first line"):
        doc_checks.example_command(example, "examples/use.py")
