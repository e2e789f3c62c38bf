"""Every fenced code block of README.md and docs/**/*.md is run, parsed, checked or exempted with its reason, and no
paragraph runs over 150 words, and the README repeats no sentence of docs/: the documentation cannot drift from the
code, nor grow walls of prose.

What happens to a block follows from its language, or from a marker on the line before its fence:

- ```python: run by tests/test_readme.py (each block a script in a fresh interpreter, training shortened);
- ```bash (sh, shell, console): each command of it is run or parsed by tests/test_documented_commands.py, whose
  ``RULES`` say how; the block is *run* when one of its commands runs, *parsed* when they are only parsed, and
  *exempt* when every command is (each rule gives its reason);
- ``<!-- block: excerpt of FILE -->`` before a ```yaml block: *parsed*, its settings equal those of FILE;
- ``<!-- block: output of TEST_FILE -->`` before a ```text block: *checked*, the longest run of fixed words of each
  message (no numbers, paths or quotes) is asserted in TEST_FILE;
- ``<!-- block: exempt: REASON -->``: *exempt*, with the reason. ``EXEMPT_ELSEWHERE`` holds the exemptions of
  documents this repository generates or that carry no marker, each with its reason.

A block nothing accounts for fails here, naming its file and line. At most ``MAX_EXEMPT`` of the blocks are exempt.
``python tests/test_doc_blocks.py`` prints every block with what happens to it, and the counts.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL_FENCES = ("bash", "sh", "shell", "console")
MAX_EXEMPT = 0.10
"""The share of blocks that may be exempt."""
MAX_PARAGRAPH_WORDS = 150
LONG_PARAGRAPHS_ALLOWED: dict[str, str] = {}
"""Documents whose paragraphs this test does not yet hold to ``MAX_PARAGRAPH_WORDS``, each with its reason."""
EXEMPT_ELSEWHERE = {
    ("docs/method.md", "m   = mean(x^2) over d, float32"): "pseudocode of BHyT's block; tests/norms/test_bhyt.py "
    "and tests/norms/test_bhyt_kernels.py check the operator it writes out",
}
"""``(document, start of the block)`` -> why it is exempt, for blocks whose document carries no marker."""

_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!-- block: (excerpt of|output of|exempt:) (.+?) -->$")


@dataclass(frozen=True)
class Block:
    """One fenced block: its document, the line of its opening fence, its language, its text and its marker."""

    path: str
    line: int
    end: int
    """The line of its closing fence."""
    language: str
    text: str
    marker: tuple[str, str] | None

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def blocks_of(path: Path) -> list[Block]:
    rel = path.relative_to(ROOT).as_posix()
    lines = path.read_text().splitlines()
    found, start, language = [], None, ""
    for number, line in enumerate(lines, 1):
        if start is None and _FENCE.match(line):
            start, language = number, _FENCE.match(line).group(1)
        elif start is not None and line.startswith("```"):
            previous = lines[start - 2] if start >= 2 else ""
            marker = _MARKER.match(previous)
            found.append(Block(rel, start, number, language, "\n".join(lines[start : number - 1]),
                               (marker.group(1).rstrip(":"), marker.group(2)) if marker else None))  # fmt: skip
            start = None
    assert start is None, f"{rel}:{start}: a fence that never closes"
    return found


BLOCKS = [block for path in DOCUMENTS for block in blocks_of(path)]


# ----------------------------------------------------------------------------- what happens to a block
def _fixed_fragments(message: str) -> list[str]:
    """The runs of words of a message that no run changes: a word with a digit, a path, a quote, a placeholder
    (``...``) or a bracket ends a run, and a leading ``program:`` tag (``error:``, ``bhyt_pl:``) is dropped."""
    words = re.sub(r"^\w+: ", "", " ".join(message.split())).split()
    runs, current = [], []
    for word in words:
        if re.search(r"[\d/'\"`()\[\]]|\.\.\.", word):
            runs.append(" ".join(current))
            current = []
        else:
            current.append(word)
    runs.append(" ".join(current))
    return [run for run in runs if run]


def _check_output(block: Block) -> str:
    test_file = ROOT / block.marker[1]
    assert test_file.is_file(), f"{block.id}: {block.marker[1]} does not exist"
    source = " ".join(test_file.read_text().split())
    for message in block.text.split("\n"):
        fragment = max(_fixed_fragments(message), key=lambda run: len(run.split()), default="")
        assert len(fragment.split()) >= 2, f"{block.id}: no fixed words to check in {message!r}"
        assert fragment in source, f"{block.id}: {block.marker[1]} does not assert {fragment!r} (of {message!r})"
    return f"the messages' fixed words are asserted in {block.marker[1]}"


def _check_excerpt(block: Block) -> str:
    quoted = ROOT / block.marker[1]
    assert quoted.is_file(), f"{block.id}: {block.marker[1]} does not exist"
    excerpt, full = yaml.safe_load(block.text), yaml.safe_load(quoted.read_text())
    differing = {key: (value, full.get(key, "<absent>")) for key, value in excerpt.items() if full.get(key) != value}
    assert not differing, f"{block.id}: settings that differ from {block.marker[1]} (excerpt, file): {differing}"
    return f"its {len(excerpt)} settings equal {block.marker[1]}'s"


def _shell_kind(block: Block) -> tuple[str, str]:
    """run / parsed / exempt from the kinds tests/test_documented_commands.py gives the block's commands."""
    from test_documented_commands import COMMANDS, RULES

    kinds = []
    for command in COMMANDS:
        if command.path == block.path and block.line < command.line < block.end:
            actions = [action for pattern, action in RULES if re.search(pattern, command.text)]
            assert len(actions) == 1, f"{command.id}: {len(actions)} rules of test_documented_commands.py match it"
            kinds.append(actions[0])
    assert kinds, f"{block.id}: a shell block without a command tests/test_documented_commands.py reads"
    by_kind = Counter(action.kind for action in kinds)
    if by_kind["run"]:
        return "run", f"{by_kind['run']} of its {len(kinds)} commands run (tests/test_documented_commands.py)"
    if by_kind["parse"]:
        return "parsed", f"{by_kind['parse']} of its {len(kinds)} commands parsed (tests/test_documented_commands.py)"
    return "exempt", "; ".join(sorted({action.how for action in kinds}))


def classify(block: Block) -> tuple[str, str]:
    """``(kind, how)``: kind is run, parsed, checked or exempt; how says what, or why not."""
    if block.marker and block.marker[0] == "exempt":
        return "exempt", block.marker[1]
    for (path, first_line), reason in EXEMPT_ELSEWHERE.items():
        if block.path == path and block.text.startswith(first_line):
            return "exempt", reason
    if block.marker and block.marker[0] == "excerpt of" and block.language == "yaml":
        return "parsed", _check_excerpt(block)
    if block.marker and block.marker[0] == "output of" and block.language == "text":
        return "checked", _check_output(block)
    if block.language == "python":
        from test_readme import python_blocks

        assert (block.path, block.line) in {(p, n) for p, n, _ in python_blocks()}, f"{block.id}: not run"
        return "run", "as a script, training shortened (tests/test_readme.py)"
    if block.language in SHELL_FENCES:
        return _shell_kind(block)
    pytest.fail(f"{block.id}: a ```{block.language} block nothing tests: run it, mark what it is "
                "(<!-- block: excerpt of FILE -->, <!-- block: output of TEST -->) or exempt it with its reason "
                "(<!-- block: exempt: REASON -->)", False)  # fmt: skip


# ----------------------------------------------------------------------------- paragraphs
def paragraphs(text: str) -> list[tuple[int, str]]:
    """``(first line, text)`` of every paragraph and list item outside code blocks, tables, headings and comments."""
    found, current, start, fence = [], [], 0, False

    def close() -> None:
        if current:
            found.append((start, " ".join(current)))
            current.clear()

    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = not fence
            close()
            continue
        if fence:
            continue
        if not stripped or stripped.startswith(("#", "|", "<!--", "![")):
            close()
            continue
        if re.match(r"^([-*]|\d+\.)\s", stripped):
            close()
        if not current:
            start = number
        current.append(stripped)
    close()
    return found


def test_paragraphs_of_the_reader_and_the_limit() -> None:
    text = "A first paragraph\non two lines.\n\n- an item\n- another\n\n| a | table |\n\n```\ncode\n```\nlast"
    expected = [(1, "A first paragraph on two lines."), (4, "- an item"), (5, "- another"), (12, "last")]
    assert paragraphs(text) == expected


def test_no_paragraph_runs_over_150_words() -> None:
    long = []
    for path in DOCUMENTS:
        rel = path.relative_to(ROOT).as_posix()
        if rel in LONG_PARAGRAPHS_ALLOWED:
            continue
        for line, paragraph in paragraphs(path.read_text()):
            words = len(paragraph.split())
            if words > MAX_PARAGRAPH_WORDS:
                long.append(f"{rel}:{line}: {words} words: {paragraph[:80]}...")
    assert not long, f"paragraphs over {MAX_PARAGRAPH_WORDS} words (split them):\n" + "\n".join(long)


def sentences(text: str, min_words: int = 8) -> set[str]:
    """The sentences of ``text`` outside code blocks with at least ``min_words`` words, whitespace folded."""
    prose = " ".join(re.sub(r"^```.*?^```", "", text, flags=re.S | re.M).split())
    return {s for s in re.split(r"(?<=[.!?])\s+", prose) if len(s.split()) >= min_words}


def test_the_readme_and_the_site_share_no_sentence() -> None:
    """The README links to the site rather than repeating it: one copy of each explanation to keep true."""
    readme = sentences((ROOT / "README.md").read_text())
    shared = [f"{path.relative_to(ROOT)}: {s}" for path in DOCUMENTS[1:] for s in readme & sentences(path.read_text())]
    assert not shared, "sentences of README.md repeated in docs/ (link to the page instead):\n" + "\n".join(shared)
    assert sentences("One two three four five six seven eight. Short one.\n```\nA b c d e f g h i.\n```") == {
        "One two three four five six seven eight."}  # fmt: skip


# ----------------------------------------------------------------------------- the tests
def test_the_reader_finds_every_kind_of_block() -> None:
    assert len(BLOCKS) > 30, "README.md and docs/ lost their code blocks, or the reader stopped finding them"
    languages = Counter(block.language for block in BLOCKS)
    assert languages["python"] >= 5 and languages["bash"] >= 15 and languages["yaml"] >= 1, languages
    assert _fixed_fragments("error: 'x/y.ckpt' is an incomplete checkpoint: shard 3 of 4") == [
        "is an incomplete checkpoint: shard", "of"]  # fmt: skip
    quick_start = next(block for block in BLOCKS if block.path == "README.md" and block.language == "bash")
    assert quick_start.text.startswith('python3 -m venv .venv && .venv/bin/pip install -e ".[dev]" && ')


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_block_is_run_parsed_checked_or_exempt_with_its_reason(block: Block) -> None:
    kind, how = classify(block)
    assert kind in ("run", "parsed", "checked", "exempt") and how, (kind, how)


def test_at_most_a_tenth_of_the_blocks_are_exempt() -> None:
    kinds = Counter(classify(block)[0] for block in BLOCKS)
    exempt = [f"{block.id}: {classify(block)[1]}" for block in BLOCKS if classify(block)[0] == "exempt"]
    assert kinds["exempt"] <= MAX_EXEMPT * len(BLOCKS), (
        f"{kinds['exempt']} of {len(BLOCKS)} blocks are exempt, more than {MAX_EXEMPT:.0%}:\n" + "\n".join(exempt)
    )


def table() -> str:
    rows = ["| block | language | test | how |", "|---|---|---|---|"]
    kinds: Counter = Counter()
    for block in BLOCKS:
        kind, how = classify(block)
        kinds[kind] += 1
        rows.append(f"| {block.id} | {block.language or 'none'} | {kind} | {how.replace('|', '/')} |")
    counts = ", ".join(f"{kinds[k]} {k}" for k in ("run", "parsed", "checked", "exempt"))
    return "\n".join(rows) + f"\n\n{len(BLOCKS)} blocks: {counts}\n"


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "tests"))
    sys.stdout.write(table())
