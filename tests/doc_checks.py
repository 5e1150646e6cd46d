"""Checks that keep the README and docs/ true to the repository (run by test_docs.py).

Each check takes the paths it reads and returns a list of problems, one line each, so the tests
can show them all at once and can run the checks on made-up trees that must fail.
"""

from __future__ import annotations

import re
from pathlib import Path

FENCE = re.compile(r"^(```|~~~)(.*)$")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_SRC = re.compile(r"<(?:img|a)\s[^>]*(?:src|href)=\"([^\"]+)\"")
INLINE_CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)
ENV_NAME = re.compile(r"\bWEFT_[A-Z0-9_]*[A-Z0-9]\b")


def prose_lines(text: str, keep_inline_code: bool = False) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code removed unless kept."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced:
            out.append((number, line if keep_inline_code else INLINE_CODE.sub("", line)))
    return out


def code_blocks(text: str, language: str) -> list[tuple[int, list[str]]]:
    """The fenced blocks whose info string is ``language``: (first line number, lines)."""
    blocks, block, start, wanted = [], None, 0, False
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line.strip())
        if fence and block is None:
            block, start, wanted = [], number + 1, fence.group(2).strip() == language
        elif fence:
            if wanted:
                blocks.append((start, block))
            block = None
        elif block is not None:
            block.append(line.rstrip())
    return blocks


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to
    hyphens, repeats numbered."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(text.replace("`", "")):
        heading = HEADING.match(line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def broken_links(pages: list[Path], root: Path) -> list[str]:
    """Every relative link or image path in ``pages`` that names no file (or no heading) in
    ``root``'s tree."""
    problems = []
    for page in pages:
        text = page.read_text()
        for number, line in prose_lines(text):
            for target in LINK.findall(line) + HTML_SRC.findall(line):
                if EXTERNAL.match(target):
                    continue
                path_part, _, anchor = target.partition("#")
                where = f"{page.relative_to(root)}:{number}: {target}"
                resolved = (page.parent / path_part).resolve() if path_part else page
                if root.resolve() not in (resolved, *resolved.parents):
                    problems.append(f"{where}: leads outside the repository")
                elif not resolved.exists():
                    problems.append(f"{where}: no such file")
                elif anchor and resolved.suffix == ".md":
                    if anchor not in heading_anchors(resolved.read_text()):
                        problems.append(f"{where}: no heading with that anchor")
    return problems


def variables_read(sources: list[Path]) -> set[str]:
    """WEFT_* variables the code reads: C++ string literals (config.cc's env calls), Python's
    os.environ.get / os.getenv, and CMake options."""
    names: set[str] = set()
    for path in sources:
        text = path.read_text()
        if path.suffix in (".cc", ".h", ".cu"):
            names |= set(re.findall(r"\"(WEFT_[A-Z0-9_]+)\"", text))
        elif path.suffix == ".py":
            names |= set(
                re.findall(r"(?:environ\.get|getenv)\(\s*[\"'](WEFT_[A-Z0-9_]+)[\"']", text)
            )
        elif path.name == "CMakeLists.txt":
            names |= set(re.findall(r"\boption\(\s*(WEFT_[A-Z0-9_]+)", text))
    return names


def variables_documented(page: Path) -> set[str]:
    """WEFT_* names in the first cell of the page's table rows and at the start of its list
    items: the variables it documents (mentions elsewhere are cross-references)."""
    names: set[str] = set()
    for _, line in prose_lines(page.read_text(), keep_inline_code=True):
        stripped = line.strip()
        if stripped.startswith("|") and not set(stripped) <= set("|-: "):
            names |= set(ENV_NAME.findall(stripped.split("|")[1]))
        elif stripped.startswith("- `WEFT_"):
            names |= set(ENV_NAME.findall(stripped.split("`")[1]))
    return names


def environment_mismatches(page: Path, sources: list[Path]) -> list[str]:
    read, documented = variables_read(sources), variables_documented(page)
    return [
        f"{name} is read but not documented in {page.name}" for name in sorted(read - documented)
    ] + [
        f"{name} is documented in {page.name} but nothing reads it"
        for name in sorted(documented - read)
    ]


def snippet_sources(readme: Path, examples: list[Path]) -> tuple[dict[int, Path], list[str]]:
    """For each Python block of the README, the example file that holds its lines in order and
    together; and a problem for each block that no example holds."""
    texts = {path: [line.rstrip() for line in path.read_text().splitlines()] for path in examples}
    found, problems = {}, []
    for start, block in code_blocks(readme.read_text(), "python"):
        while block and not block[-1]:
            block.pop()
        holder = next((p for p, lines in texts.items() if contains_run(lines, block)), None)
        if holder is None:
            problems.append(
                f"{readme.name}:{start}: this Python block is in no file under examples/: "
                "put it in an example that a test runs, and show it from there"
            )
        else:
            found[start] = holder
    return found, problems


def contains_run(lines: list[str], run: list[str]) -> bool:
    if not run:
        return True
    return any(lines[i : i + len(run)] == run for i in range(len(lines) - len(run) + 1))


def example_command(example: Path, path: str) -> list[str]:
    """The command an example's docstring gives on its first line, after the colon:
    ``torchrun --nproc-per-node N <path>`` or ``python <path>``, ``path`` being where the
    example lies in the repository (examples/x.py)."""
    first = example.read_text().split('"""')[1].splitlines()[0]
    command = first.rpartition(": ")[2].split()
    if not command or command[0] not in ("torchrun", "python") or command[-1] != path:
        raise ValueError(
            f"{example}: the docstring's first line must end with ': torchrun ... {path}' or "
            f"': python {path}'"
        )
    return command
