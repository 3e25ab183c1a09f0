#!/usr/bin/env python
"""Plot the training curves (training loss, evaluation loss and metrics, learning rate) of one or more runs.

The training scripts already write `training_curves.png` at the end of a run; this redraws it from a run folder or a
checkpoint (for a run still in progress or interrupted), or compares several runs in one figure.

```bash
python scripts/tools/plot_training.py out/sst2                       # -> out/sst2/training_curves.png
python scripts/tools/plot_training.py out/sst2/checkpoint-200 --output curves.png
python scripts/tools/plot_training.py out/sst2-dense out/sst2-sbm --output compare.png
```
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnzoo.training import plot_training_curves
from attnzoo.training.callbacks import LOG_HISTORY_FILE, PLOT_FILE


def read_log_history(run: Path) -> list[dict[str, Any]]:
    """The log history of a run folder (`log_history.json`) or checkpoint (`trainer_state.json`)."""
    for name in (LOG_HISTORY_FILE, "trainer_state.json"):
        path = run / name
        if path.is_file():
            data = json.loads(path.read_text())
            return data["log_history"] if isinstance(data, dict) else data
    raise ValueError(f"No {LOG_HISTORY_FILE} or trainer_state.json in '{run}'.")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Plot training curves of attnzoo runs.")
    parser.add_argument("runs", nargs="+", help="Run folders or checkpoint folders.")
    parser.add_argument("--output", default=None, help=f"PNG to write (default: <first run>/{PLOT_FILE}).")
    args = parser.parse_args(argv)
    runs = [Path(run) for run in args.runs]
    try:
        histories = [read_log_history(run) for run in runs]
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if len(runs) == 1:
        history = histories[0]
    else:
        # Prefix every logged value with its run name so the runs share panels but keep separate lines.
        history = [
            {"step": entry["step"], **{_renamed(key, run.name): v for key, v in entry.items() if key != "step"}}
            for run, entries in zip(runs, histories, strict=True)
            for entry in entries
            if "step" in entry
        ]
    output = Path(args.output) if args.output else runs[0] / PLOT_FILE
    written = plot_training_curves(history, output)
    if written is None:
        print("error: nothing to plot (no logged values, or matplotlib missing).", file=sys.stderr)
        return 2
    print(f"wrote {written}")
    return 0


def _renamed(key: str, run: str) -> str:
    # Keep the `eval_` prefix first: the plot groups evaluation values by it.
    if key.startswith("eval_"):
        return f"eval_{run}:{key[5:]}"
    return f"{run}:{key}"


if __name__ == "__main__":
    sys.exit(main())
