"""One seal task's memory as its folder grows: `seal_folder` (what each task of the seal job
runs) on the largest hour folder of a date that `seal_day.py --keep` left, its inputs given
`--times` times over (the same files read again), each size in a fresh process. A folder of
1M/24 records read 10 times is what a task of a 10M-record date reads.

    .venv/bin/python benchmarks/seal_day.py --records 1000000 --keep ...   # prints kept <work>
    .venv/bin/python benchmarks/seal_folder_rss.py <work> --times 1,3,10

Prints, per size, the records read, peak RSS (`ru_maxrss`, imports included) and CPU seconds.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cairn.datafiles.seal_writer import seal_folder
from cairn.pipeline.seal import Selection
from cairn.storage.objects import Storage


def one(work: Path, times: int) -> str:
    """Seal the largest folder `times` over, in this process; one line of results."""
    claim = next((work / "archive" / "_claims").glob("*/seal/*.json"))
    chosen = Selection.model_validate_json(claim.read_text())
    i = max(range(len(chosen.folders)), key=lambda i: len(chosen.folders[i].inputs))
    folder = chosen.folders[i]
    folder.inputs = folder.inputs * times
    cpu = time.process_time()
    with tempfile.TemporaryDirectory() as out:
        staged, table = (Storage((Path(out) / n).as_uri()) for n in ("staged", "table"))
        unsealed = Storage((work / "unsealed").as_uri())
        result = seal_folder(chosen, i, "deflate", unsealed, staged, table)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return (
        f"{folder.folder} x{times}: {len(folder.inputs)} files, {result.records_read:,} records, "
        f"peak RSS {peak} MB, CPU {time.process_time() - cpu:.1f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path, help="a folder seal_day.py --keep kept")
    parser.add_argument("--times", default="1,3,10")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(one(args.work, args.one), flush=True)
        return 0
    for times in (int(t) for t in args.times.split(",")):
        argv = [sys.executable, __file__, str(args.work), "--one", str(times)]
        subprocess.run(argv, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
