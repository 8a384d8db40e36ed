"""A C source of ours compiled for this machine at first use, cached, and loaded with ctypes.

The attention and layer kernels in `csrc/` need an x86 CPU with AVX512-BF16 (`REQUIRED_CPU_FLAGS`), the
GGUF block products AVX512-VNNI too, or AVX2 for their twin `block_linear_avx2.c`; elsewhere, with no
compiler, or when the build fails, `load_or_none` says why in the log and the caller keeps torch's path.

The kernels in `csrc/` are built with `-march=native` on the machine that runs them (as inductor
and Triton build theirs), so the binary is keyed by the source, the flags, the compiler and this
CPU's model and flags: a cache directory shared between different machines never hands one a
binary built for another. The build writes to a temporary name and renames it into place, so
workers starting together never load a half-written file, and holds a lock on the target's name
while it compiles, so they wait for one build rather than each compiling the same source. torch is
imported before any library is loaded: a kernel built with `-fopenmp` then binds to the OpenMP
runtime torch already loaded (the same soname), so its threads are torch's intra-op threads, not a
second pool competing for cores.

Where there is no compiler (the Docker image keeps none), a library built ahead of time by
`prebuild.py` for a named target (`PORTABLE_FLAGS`: every CPU with `PORTABLE_CPU_FLAGS`; x86-64-v3
for the AVX2 twin, `portable_target`) and kept beside the sources in `prebuilt/` is loaded instead,
on a CPU that has those flags.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import torch  # noqa: F401  (loaded first: see the module docstring)

from ztgi.common.model_source import cache_root

if TYPE_CHECKING:
    from ctypes import _NamedFuncPointer

logger = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).with_name("csrc")
# no -ffast-math: it reorders the hand-written float arithmetic, and results must round where torch's do
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared", f"-I{SOURCE_DIR}")
REQUIRED_CPU_FLAGS = ("avx512f", "avx512_bf16")
AVX2_CPU_FLAGS = ("avx2", "fma", "f16c")  # what the `*_avx2.c` sources need (float32 kernels, the block products' twin)
# sources with no intrinsics of their own (they call the others through pointers): any x86-64 CPU
PLAIN_SOURCES = ("llama_decode_stack",)
# The ahead-of-time build: x86-64-v4 (AVX512 F, BW, CD, DQ, VL) with BF16 and VNNI instead of this machine's -march
PORTABLE_FLAGS = tuple(flag for flag in FLAGS if flag != "-march=native") + (
    "-march=x86-64-v4", "-mavx512bf16", "-mavx512vnni")
PORTABLE_CPU_FLAGS = ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_bf16", "avx512_vnni")
# The ahead-of-time build of a source for CPUs without AVX512 (`*_avx2.c`): x86-64-v3 and what it needs
AVX2_PORTABLE_FLAGS = tuple(flag for flag in FLAGS if flag != "-march=native") + ("-march=x86-64-v3",)
AVX2_PORTABLE_CPU_FLAGS = ("avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe")
PREBUILT_DIR = SOURCE_DIR.with_name("prebuilt")
BUILD_TIMEOUT_S = 120


class BuildError(RuntimeError):
    """The library could not be built or loaded here; the message says why."""


POINTER, INT, INT64, FLOAT = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
Kernel: TypeAlias = "_NamedFuncPointer"  # a C function of a loaded library, called with its declared argument types


def bind(library: ctypes.CDLL, name: str, argtypes: list[type[ctypes._SimpleCData]]) -> Kernel:
    """`library.name` with its argument types declared; every kernel returns an int status (0: done)."""
    function = getattr(library, name)
    function.argtypes = argtypes
    function.restype = INT
    return function


def address(function: Kernel) -> int:
    """Where a bound kernel lives, for C code that calls it through a function pointer."""
    return ctypes.cast(function, ctypes.c_void_p).value or 0


@functools.cache
def _cpuinfo_lines() -> tuple[str, ...]:
    try:
        return tuple(Path("/proc/cpuinfo").read_text().splitlines())
    except OSError:
        return ()


def cpu_flags() -> set[str]:
    """This CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    line = next((line for line in _cpuinfo_lines() if line.startswith("flags")), None)
    return set(line.split(":", 1)[1].split()) if line else set()


def load_or_none(source_name: str, purpose: str,
                 needs: tuple[str, ...] = REQUIRED_CPU_FLAGS) -> ctypes.CDLL | None:
    """`load`, or None with a log line that says why `purpose` stays on torch's path."""
    try:
        return load(source_name, needs)
    except BuildError as exc:
        logger.warning("%s: torch's, the C kernel cannot run here: %s", purpose, exc)
        return None


def load(source_name: str, needs: tuple[str, ...] = REQUIRED_CPU_FLAGS,
         prebuilt_dir: Path = PREBUILT_DIR) -> ctypes.CDLL:
    """`csrc/<source_name>` built for this machine (once; cached) and loaded, or without a compiler the
    library prebuilt in `prebuilt_dir`; BuildError if neither can be (`needs`: the CPU flags the
    source's instructions need)."""
    missing = [flag for flag in needs if flag not in cpu_flags()]
    if platform.machine() not in ("x86_64", "AMD64") or missing:
        raise BuildError("it needs an x86 CPU" + (f" with {', '.join(needs)}" if needs else ""))
    source = SOURCE_DIR / source_name
    try:
        compiler = find_compiler()
        target = Path(cache_root()) / "kernels" / f"{source.stem}-{_build_key(source, compiler)}.so"
    except BuildError:
        prebuilt = prebuilt_path(source, prebuilt_dir)
        if not prebuilt.exists() or not set(portable_target(source)[1]) <= cpu_flags():
            raise
        return _open(prebuilt)
    if not target.exists():
        with _build_lock(target):
            if not target.exists():  # another process may have built it while this one waited
                build(compiler, source, target)
    return _open(target)


@contextlib.contextmanager
def _build_lock(target: Path) -> Iterator[None]:
    """An exclusive lock on `target`'s lock file (in the cache directory, kept) while held; where
    the directory cannot hold one, no lock: each process builds as it would alone."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = open(target.with_suffix(".lock"), "a")
    except OSError:
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def portable_target(source: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The flags of `source`'s ahead-of-time build and the CPU flags that build needs: x86-64-v3 for a
    source written for CPUs without AVX512 (`*_avx2.c`) or with no intrinsics (`PLAIN_SOURCES`), else
    x86-64-v4 with BF16 and VNNI."""
    if source.stem.endswith("_avx2") or source.stem in PLAIN_SOURCES:
        return AVX2_PORTABLE_FLAGS, AVX2_PORTABLE_CPU_FLAGS
    return PORTABLE_FLAGS, PORTABLE_CPU_FLAGS


def prebuilt_path(source: Path, directory: Path = PREBUILT_DIR) -> Path:
    """Where `prebuild.py` puts `source` built for its portable target (keyed by the source, headers and flags)."""
    return directory / f"{source.stem}-{_source_key(source, portable_target(source)[0])}.so"


def _open(library: Path) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(str(library))
    except OSError as exc:
        raise BuildError(f"cannot load {library}: {exc}") from exc


def find_compiler() -> str:
    """The C compiler: `CC`, else `cc`, else `gcc`; BuildError when there is none."""
    found = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not found:
        raise BuildError("no C compiler found (set CC, or install gcc)")
    return found


def _build_key(source: Path, compiler: str) -> str:
    return _source_key(source, FLAGS, _compiler_version(compiler), _cpu_identity())


def _source_key(source: Path, flags: tuple[str, ...], *more: str) -> str:
    digest = hashlib.sha256()
    headers = [header.read_bytes() for header in sorted(SOURCE_DIR.glob("*.h"))]
    for part in (source.read_bytes(), *headers, " ".join(flags).encode(), *(text.encode() for text in more)):
        digest.update(part)
    return digest.hexdigest()[:16]


def _compiler_version(compiler: str) -> str:
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"the C compiler {compiler!r} does not run: {exc}") from exc


def _cpu_identity() -> str:
    model = next((line for line in _cpuinfo_lines() if line.startswith("model name")), "")
    return model + " ".join(sorted(cpu_flags()))


def build(compiler: str, source: Path, target: Path, flags: tuple[str, ...] = FLAGS) -> None:
    """`source` compiled with `flags` into `target`, written under a temporary name and renamed into place."""
    partial = target.with_name(f"{target.stem}.{os.getpid()}.partial")
    command = [compiler, *flags, "-o", str(partial), str(source), "-lm"]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise BuildError(f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}")
        os.replace(partial, target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"{' '.join(command)}: {exc}") from exc
    finally:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
    logger.info("built %s", target)
