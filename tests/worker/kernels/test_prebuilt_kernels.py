"""The kernels built ahead of time (prebuild.py, as the Docker image's build stage runs it) load where
no compiler is: the runtime image's case, a `CC` that names no program here."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from ztgi.services.worker.kernels import native_library
from ztgi.services.worker.kernels.prebuild import prebuild

PORTABLE = native_library.PORTABLE_CPU_FLAGS
needs_portable_cpu = pytest.mark.skipif(not set(PORTABLE) <= native_library.cpu_flags(),
                                        reason="the prebuilt kernels need " + ", ".join(PORTABLE))


# The libraries these tests load, not every source: the AVX512 block products alone take longer to
# compile than all of these (the Docker image's build stage builds every one, and the compose test
# serves from that image).
LOADED = ("paged_decode_attention.c", "layer_ops.c", "block_linear_avx2.c", "layer_ops_avx2.c",
          "paged_decode_attention_avx2.c", "llama_decode_stack.c")


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("prebuilt")
    built = prebuild(directory, LOADED)
    assert sorted(path.name.split("-")[0] for path in built) == sorted(name[:-2] for name in LOADED)
    return directory


@needs_portable_cpu
def test_without_a_compiler_the_prebuilt_library_loads(prebuilt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    library = native_library.load("paged_decode_attention.c", prebuilt_dir=prebuilt)
    expected = native_library.prebuilt_path(native_library.SOURCE_DIR / "paged_decode_attention.c", prebuilt)
    assert library._name == str(expected)
    kernel = native_library.bind(library, "paged_decode_attention_bf16", [ctypes.c_void_p])
    assert native_library.address(kernel) != 0


def test_without_a_compiler_or_a_prebuilt_library_the_reason_is_the_compiler(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    if not set(native_library.REQUIRED_CPU_FLAGS) <= native_library.cpu_flags():
        pytest.skip("the kernels need " + ", ".join(native_library.REQUIRED_CPU_FLAGS))
    with pytest.raises(native_library.BuildError, match="does not run"):
        native_library.load("paged_decode_attention.c", prebuilt_dir=tmp_path)


def test_a_changed_flag_set_is_another_library(prebuilt: Path) -> None:
    """The key follows the flags: a library built with -march=native never passes for the portable one."""
    source = native_library.SOURCE_DIR / "layer_ops.c"
    assert native_library.prebuilt_path(source, prebuilt).exists()
    assert native_library._source_key(source, native_library.FLAGS) not in native_library.prebuilt_path(source).name


@pytest.mark.skipif(not set(native_library.AVX2_PORTABLE_CPU_FLAGS) <= native_library.cpu_flags(),
                    reason="the AVX2 twin's prebuilt library needs x86-64-v3's flags")
@pytest.mark.parametrize("source_name,function", [
    ("block_linear_avx2.c", "block_linear"), ("layer_ops_avx2.c", "add_rms_norm_f32"),
    ("paged_decode_attention_avx2.c", "paged_decode_attention_f32"), ("llama_decode_stack.c", "llama_decode_stack")])
def test_without_a_compiler_the_avx2_kernels_load_on_an_x86_64_v3_cpu(
        prebuilt: Path, monkeypatch: pytest.MonkeyPatch, source_name: str, function: str) -> None:
    """The block products' twin, the float32 layer steps and decode attention for CPUs without
    AVX512, and the decode stack (no intrinsics of its own) are built for x86-64-v3, so a Docker
    image on an AVX2 host serves a GGUF as stored with them too."""
    monkeypatch.setenv("CC", "/nonexistent/cc")
    source = native_library.SOURCE_DIR / source_name
    assert "-march=x86-64-v3" in native_library.portable_target(source)[0]
    library = native_library.load(source_name, prebuilt_dir=prebuilt, needs=("avx2",))
    assert library._name == str(native_library.prebuilt_path(source, prebuilt))
    assert native_library.address(native_library.bind(library, function, [ctypes.c_void_p])) != 0
