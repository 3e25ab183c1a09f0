"""The CNN/DailyMail `.story` file format: article paragraphs, then summary sentences each after an `@highlight`
line."""

from __future__ import annotations

from pathlib import Path

HIGHLIGHT_MARKER = "@highlight"


def story_parts(path: str | Path) -> tuple[list[str], list[str]]:
    """Read a `.story` file into its non-empty, stripped article lines and highlight (summary) sentences.

    Everything after the first `@highlight` marker is summary text; the markers themselves are format noise.
    """
    article: list[str] = []
    highlights: list[str] = []
    in_highlight = False
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        if line == HIGHLIGHT_MARKER:
            in_highlight = True
            continue
        (highlights if in_highlight else article).append(line)
    return article, highlights
