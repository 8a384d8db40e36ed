"""Every C kernel built ahead of time for a portable target, for an install that will have no compiler.

The Docker image runs this in its build stage (which has gcc) and copies the libraries, not the
compiler, into the runtime stage: `native_library.load` takes them where it finds no compiler, on
any CPU with `PORTABLE_CPU_FLAGS` (x86-64-v3's flags for the AVX2 twin of the block products).
Where a compiler is found, the first start still builds for the machine's own CPU (`-march=native`),
as before.

    python -m ztgi.services.worker.kernels.prebuild [DIR]   (default: native_library.PREBUILT_DIR)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ztgi.services.worker.kernels.native_library import (
    PREBUILT_DIR,
    SOURCE_DIR,
    build,
    find_compiler,
    portable_target,
    prebuilt_path,
)


def prebuild(directory: Path = PREBUILT_DIR, names: Sequence[str] | None = None) -> list[Path]:
    """Each `csrc/*.c` (or those of `names`) compiled for its portable target (`portable_target`)
    into `directory`, one compiler process per core at a time; the libraries' paths."""
    compiler = find_compiler()
    sources = sorted(SOURCE_DIR.glob("*.c")) if names is None else [SOURCE_DIR / name for name in names]
    targets = [prebuilt_path(source, directory) for source in sources]

    def build_one(source: Path, target: Path) -> None:
        build(compiler, source, target, portable_target(source)[0])

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(build_one, sources, targets))  # list: a failed build raises here
    return targets


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    for library in prebuild(Path(args[0]) if args else PREBUILT_DIR):
        print(library)
    return 0


if __name__ == "__main__":
    sys.exit(main())
