"""ListOps as in Long Range Arena (Tay et al. 2021, after Nangia and Bowman 2018), seeded and generated on the fly.

An example is a nested list of operations on single digits, written in prefix form with a closing bracket, e.g.
`[MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]`; the label is its value (ten classes, 0-9). The operators are MAX, MIN,
MED (the median, truncated to an integer: `int(median)`, which reproduces every label of the first 100 rows of the
original test file) and SM (the sum modulo 10). LRA's settings: at most 10 arguments per operation, nesting depth at
most 10, sequences of 500-2000 tokens. Reaching the long range is the point of the task: the value depends on every
token, and the outermost operation's arguments are spread over the whole sequence.

The generator is written from that description: a node is an operation with 2 to `max_args` arguments, each of which
is again an operation with probability `branch_probability` (while the depth allows it) or a digit. Trees are drawn
until one's token count falls in `[min_length, max_length]` (rejection sampling), so the lengths are those of the
unconstrained tree distribution restricted to the range.
"""

from __future__ import annotations

import random
import statistics
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
CLOSE = "]"
DIGITS = tuple(str(d) for d in range(10))
#: Symbols of the task in a fixed order; token ids are `first_id + index` (after the special tokens of the zoo).
VOCABULARY = (*OPERATORS, CLOSE, *DIGITS)
# Parentheses appear in Nangia and Bowman's original (binarised) files; they carry no meaning and are skipped.
_IGNORED = frozenset({"(", ")"})


def _apply(operator: str, args: Sequence[int]) -> int:
    if operator == "[MAX":
        return max(args)
    if operator == "[MIN":
        return min(args)
    if operator == "[MED":
        return int(statistics.median(args))
    if operator == "[SM":
        return sum(args) % 10
    raise ValueError(f"Unknown ListOps operator {operator!r}; expected one of {OPERATORS}.")


def evaluate_listops(tokens: Sequence[str]) -> int:
    """Value (0-9) of a ListOps expression given as tokens (parentheses of the original files are ignored).

    Raises:
        ValueError: The expression is malformed (unbalanced brackets, a digit outside an operation, unknown token).
    """
    stack: list[tuple[str, list[int]]] = []
    result: int | None = None
    for token in tokens:
        if token in _IGNORED:
            continue
        if result is not None:
            raise ValueError(f"Token {token!r} after the end of the expression.")
        if token in OPERATORS:
            stack.append((token, []))
        elif token == CLOSE:
            if not stack:
                raise ValueError("`]` without an open operation.")
            operator, args = stack.pop()
            if not args:
                raise ValueError(f"Operation {operator} has no arguments.")
            value = _apply(operator, args)
            if stack:
                stack[-1][1].append(value)
            else:
                result = value
        elif token in DIGITS:
            if not stack:
                raise ValueError(f"Digit {token} outside an operation.")
            stack[-1][1].append(int(token))
        else:
            raise ValueError(f"Unknown ListOps token {token!r}.")
    if result is None:
        raise ValueError("Unterminated ListOps expression (missing `]`).")
    return result


@dataclass(frozen=True)
class ListOpsSettings:
    """
    Shape of the generated trees (defaults: LRA's ListOps).

    Args:
        min_length / max_length: accepted token counts (inclusive).
        max_depth: deepest nesting level (the outer operation is depth 1).
        max_args: most arguments of one operation (at least 2).
        branch_probability: chance that an argument is a nested operation rather than a digit.
    """

    min_length: int = 500
    max_length: int = 2000
    max_depth: int = 10
    max_args: int = 10
    branch_probability: float = 0.25

    def __post_init__(self) -> None:
        if not 1 <= self.min_length <= self.max_length:
            raise ValueError(f"Need 1 <= min_length <= max_length, got {self.min_length}, {self.max_length}.")
        if self.max_depth < 1 or self.max_args < 2:
            raise ValueError(f"Need max_depth >= 1 and max_args >= 2, got {self.max_depth}, {self.max_args}.")
        if not 0.0 < self.branch_probability < 1.0:
            raise ValueError(f"branch_probability must be in (0, 1), got {self.branch_probability}.")


def _tree_tokens(rng: random.Random, settings: ListOpsSettings, depth: int, budget: int) -> list[str] | None:
    """Tokens of one random operation, or `None` as soon as it would exceed `budget` tokens (a rejected draw)."""
    tokens = [rng.choice(OPERATORS)]
    for _ in range(rng.randint(2, settings.max_args)):
        if depth < settings.max_depth and rng.random() < settings.branch_probability:
            sub = _tree_tokens(rng, settings, depth + 1, budget - len(tokens) - 1)
            if sub is None:
                return None
            tokens.extend(sub)
        else:
            tokens.append(rng.choice(DIGITS))
        if len(tokens) + 1 > budget:
            return None
    tokens.append(CLOSE)
    return tokens


def sample_listops(rng: random.Random, settings: ListOpsSettings | None = None) -> tuple[list[str], int]:
    """One example `(tokens, label)` with `min_length <= len(tokens) <= max_length`."""
    settings = settings or ListOpsSettings()
    while True:
        tokens = _tree_tokens(rng, settings, 1, settings.max_length)
        if tokens is not None and len(tokens) >= settings.min_length:
            return tokens, evaluate_listops(tokens)


def generate_listops(seed: int, settings: ListOpsSettings | None = None) -> Iterator[tuple[list[str], int]]:
    """An endless, reproducible stream of examples (the same `seed` gives the same stream)."""
    rng = random.Random(seed)
    while True:
        yield sample_listops(rng, settings)


def shallow_baselines(
    train: Iterable[tuple[Sequence[str], int]], validation: Sequence[tuple[Sequence[str], int]]
) -> dict[str, float]:
    """Validation accuracy of two predictors fitted on `train` that read at most one token of an example.

    `majority_class` predicts the most frequent training label; `first_operator` predicts the most frequent training
    label of examples with the same outermost operator (the first token). The second is the bar a model clears by
    reading a single position: MAX trees mostly evaluate to 9 and MIN trees to 0, which alone gives about 37% on
    LRA's settings (LRA's full Transformer: 36.4%), so a model near that score need not compose anything.

    Raises:
        ValueError: `train` or `validation` is empty.
    """
    overall: Counter[int] = Counter()
    by_operator: dict[str, Counter[int]] = {}
    for tokens, label in train:
        overall[label] += 1
        by_operator.setdefault(tokens[0], Counter())[label] += 1
    if not overall or not validation:
        raise ValueError("shallow_baselines needs at least one training and one validation example.")
    majority = overall.most_common(1)[0][0]
    per_operator = {operator: counts.most_common(1)[0][0] for operator, counts in by_operator.items()}
    hits_majority = sum(label == majority for _, label in validation)
    hits_operator = sum(label == per_operator.get(tokens[0], majority) for tokens, label in validation)
    return {"majority_class": hits_majority / len(validation), "first_operator": hits_operator / len(validation)}
