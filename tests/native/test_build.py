"""native.build on a folder of small kernels written here: a kernel another source includes is
loaded from that one's library, a load builds only the library it needs, prebuilt libraries
compile side by side, an early compile needs no OpenMP runtime (torch) and a later load only
links it, a broken including source falls back to the kernel's own, and nothing is built
where kernels cannot run."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from langchain_ascend.native import build

pytestmark = pytest.mark.skipif(build.host_problem() is not None,
                                reason=f"native kernels cannot run here: {build.host_problem()}")

SOURCES = {
    "alpha": "int alpha_value(void) { return 1; }\n",
    "beta": '#include "alpha.c"\nint beta_value(void) { return alpha_value() + 1; }\n',
    "gamma": "int gamma_value(void) { return 3; }\n",
}


@pytest.fixture
def kernels(tmp_path, monkeypatch) -> list[tuple[str, float, float]]:
    """A source folder of three kernels, an empty build cache and fresh module state; returns
    the (kernel, start, end) of every compile."""
    source_dir = tmp_path / "src"
    source_dir.mkdir()
    for name, text in SOURCES.items():
        (source_dir / f"{name}.c").write_text(text)
    monkeypatch.setattr(build, "SOURCE_DIR", source_dir)
    monkeypatch.setenv(build.CACHE_ENV_VAR, str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setattr(build, "_functions", {})
    monkeypatch.setattr(build, "_builds", {})
    build.included_kernels.cache_clear()
    compiles: list[tuple[str, float, float]] = []
    real_compile = build._compile_object

    def timed_compile(compiler_path: str, source: Path, target: Path) -> None:
        start = time.perf_counter()
        time.sleep(0.3)  # long enough for the other build to start meanwhile
        real_compile(compiler_path, source, target)
        compiles.append((source.stem, start, time.perf_counter()))

    monkeypatch.setattr(build, "_compile_object", timed_compile)
    yield compiles
    build.included_kernels.cache_clear()


def test_provider_is_the_including_kernel(kernels) -> None:
    assert build.kernel_names() == ["alpha", "beta", "gamma"]
    assert build.included_kernels("beta") == frozenset({"alpha"})
    assert [build.provider(name) for name in ("alpha", "beta", "gamma")] == [
        "beta", "beta", "gamma"]


def test_package_kernels_come_from_the_decode_stack() -> None:
    build.included_kernels.cache_clear()
    for name in ("matvec", "rms_norm", "rope_kv", "paged_attention", "qmatmul"):
        assert build.provider(name) == "decode_stack"
    assert build.provider("block_layout") == "block_layout"


def test_a_load_builds_only_the_library_it_needs(kernels) -> None:
    alpha = build.function("alpha", "alpha_value", [])
    assert alpha() == 1
    assert "beta-" in build.load("alpha").reason
    assert build.function("beta", "beta_value", [])() == 2
    assert [name for name, _, _ in kernels] == ["beta"]  # alpha never alone, gamma not needed
    assert build.jobs_in_flight() == []


def test_prebuilt_libraries_compile_side_by_side(kernels) -> None:
    assert build.prebuild() == ["beta", "gamma"]
    build.wait_for_builds()
    assert build.function("gamma", "gamma_value", [])() == 3
    (_, beta_start, beta_end), (_, gamma_start, gamma_end) = sorted(kernels)
    assert gamma_start < beta_end and beta_start < gamma_end  # the two compiles overlapped


def test_an_early_compile_needs_no_openmp_runtime_and_a_load_only_links_it(kernels,
                                                                         monkeypatch) -> None:
    real_runtime = build.openmp_runtime

    def no_runtime() -> str | None:
        raise AssertionError("an early compile must not look for torch's OpenMP runtime")

    monkeypatch.setattr(build, "openmp_runtime", no_runtime)
    assert build.start_compiles(["gamma"]) == ["gamma"]
    assert build.start_compiles(["gamma"]) == ["gamma"]  # in flight: not started twice
    assert [name.split("-")[0] for name in build.jobs_in_flight()] == ["gamma"]
    assert build.jobs_in_flight()[0].endswith(".o")
    build.wait_for_builds()
    assert build.jobs_in_flight() == []
    assert build.start_compiles(["gamma"]) == []  # compiled
    monkeypatch.setattr(build, "openmp_runtime", real_runtime)
    assert build.function("gamma", "gamma_value", [])() == 3
    assert [name for name, _, _ in kernels] == ["gamma"]  # linked, not compiled again


def test_loads_wait_for_a_build_in_flight(kernels) -> None:
    assert build.prebuild() == ["beta", "gamma"]
    assert build.prebuild(["gamma"]) == ["gamma"]  # in flight: not started twice
    results = []
    threads = [threading.Thread(target=lambda: results.append(build.load("gamma").lib))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 3 and all(lib is not None for lib in results)
    assert sorted(name for name, _, _ in kernels).count("gamma") == 1
    build._builds[build._start_build("beta")[0]].result(timeout=60)
    assert build.prebuild() == []  # everything built


def test_no_early_compile_where_the_library_is_built(kernels) -> None:
    """A cache older than object files holds libraries only: nothing compiles again."""
    assert build.function("gamma", "gamma_value", [])() == 3
    for obj in build.cache_dir().glob("*.o"):
        obj.unlink()
    assert build.start_compiles(["gamma"]) == []
    assert [name for name, _, _ in kernels] == ["gamma"]


def test_a_broken_including_source_falls_back_to_the_kernel_alone(kernels, caplog) -> None:
    (build.SOURCE_DIR / "beta.c").write_text('#include "alpha.c"\nint beta_value(void) { oops }\n')
    assert build.function("alpha", "alpha_value", [])() == 1
    assert "alpha-" in build.load("alpha").reason
    assert build.load("beta").lib is None
    assert "build failed" in build.load("beta").reason
    assert any("building alpha.c alone" in record.message for record in caplog.records)


def test_nothing_is_built_where_kernels_cannot_run(kernels, monkeypatch) -> None:
    monkeypatch.setenv(build.DISABLE_ENV_VAR, "0")
    assert build.prebuild() == []
    assert build.start_compiles() == []
    assert build.load("gamma").lib is None
    assert kernels == []


def test_torch_openmp_runtime_is_found_beside_another_wheels(monkeypatch) -> None:
    """faiss-cpu maps its own libgomp: torch's is still the one the kernels link (once faiss
    was imported first, every kernel of the process was refused)."""
    import torch

    torch_gomp = str(Path(torch.__file__).parent / "lib" / "libgomp.so.1")
    other = "/site-packages/faiss_cpu.libs/libgomp-e985bcbb.so.1.0.0"
    monkeypatch.setattr(build, "mapped_openmp_libraries", lambda: {other, torch_gomp})
    assert build.openmp_runtime() == torch_gomp
    monkeypatch.setattr(build, "mapped_openmp_libraries", lambda: {other})
    assert build.openmp_runtime() == other
    monkeypatch.setattr(build, "mapped_openmp_libraries", lambda: {other, other + ".2"})
    assert build.openmp_runtime() is None
