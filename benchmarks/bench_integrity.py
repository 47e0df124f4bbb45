"""What the checksums cost: a capture shard written with safetensors, then checksummed as write_shard does
(xxh3-64 read back while the page cache holds it), and `eyas verify`'s full re-read.

    python benchmarks/bench_integrity.py [--mib 1024] [--repeat 3] [--dir /tmp]

Prints the write time, the checksum time and its share of the write, in GB/s. The shard is bf16 aux
states of gpt-oss-120b's shape (3 x 2880 per token); --mib sets its size.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from eyas.infra.integrity import file_record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", default=None, help="where to write (default: the system temporary directory)")
    args = p.parse_args()
    width = 3 * 2880
    tokens = args.mib * 2**20 // (2 * width)
    aux = torch.randn(tokens, width).to(torch.bfloat16)  # (N_tok, 3*H) bf16
    writes, sums = [], []
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        path = Path(d) / "shard-00000.safetensors"
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            save_file({"aux": aux}, str(path))
            t1 = time.perf_counter()
            file_record(path)
            t2 = time.perf_counter()
            writes.append(t1 - t0)
            sums.append(t2 - t1)
            path.unlink()
    size = tokens * width * 2 / 1e9
    w, c = statistics.median(writes), statistics.median(sums)
    print(f"shard {size:.2f} GB ({tokens} tokens of 3x2880 bf16), median of {args.repeat}:")
    print(f"  write (safetensors save_file) {w:.3f} s  {size / w:.2f} GB/s")
    print(
        f"  checksum (xxh3-64 read back)  {c:.3f} s  {size / c:.2f} GB/s  = {100 * c / w:.1f}% of the write"
    )


if __name__ == "__main__":
    main()
