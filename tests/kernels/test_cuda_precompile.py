"""Compiling CUDA kernels ahead into MLX's PTX cache (kernels/cuda_precompile.py).

On any machine: our ``std::hash`` is libstdc++'s (checked against a C++ program built here), the
generated source follows MLX's ``build_kernel`` layout, and long module names split as MLX's
``get_ptx_path`` does. On an NVIDIA GPU (``-m cuda``): MLX really loads a file we wrote under the
module name we computed (a decoy kernel written under that name runs instead of the real one), and
kernels compiled ahead run correctly.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from kernelfleet.kernels.catalog import get_spec
from kernelfleet.kernels.render import cuda_precompile as cp
from kernelfleet.kernels.render import nvrtc
from kernelfleet.kernels.render.launch import KernelSource, Launch, capture, run
from kernelfleet.worker.backends.cuda import CudaBackend

CXX = shutil.which("clang++") or shutil.which("g++") or shutil.which("c++")

HASH_PROGRAM = r"""
#include <functional>
#include <iostream>
#include <string>
int main() {
  std::string s;
  while (std::getline(std::cin, s, '\0')) std::cout << std::hex << std::hash<std::string>{}(s) << "\n";
}
"""


def _add_one(name: str) -> KernelSource:
    return KernelSource(name=name, inputs=("inp",), outputs=("out",), body="""
    KF_UINT i = KF_GID;
    if (i < N) { out[i] = inp[i] + T(1); }
""")


def _launch(n: int) -> Launch:
    return Launch((n, 1, 1), (32, 1, 1), (("T", mx.float32), ("N", n)))


def _record(src: KernelSource, n: int = 64) -> cp.LaunchRecord:
    with capture() as records:
        run(src, "cuda", [mx.zeros((n,), mx.float32)], _launch(n), [(n,)], [mx.float32])
    return records[0]


@pytest.mark.skipif(CXX is None, reason="no C++ compiler (apt-get install clang)")
def test_std_hash_is_libstdcxx(tmp_path: Path) -> None:
    exe = tmp_path / "hash"
    (tmp_path / "hash.cpp").write_text(HASH_PROGRAM)
    subprocess.run([CXX, "-O1", "-o", str(exe), str(tmp_path / "hash.cpp")], check=True, capture_output=True)
    spec = get_spec("rmsnorm")
    shape = (4096, 4096)
    inputs = [mx.zeros(shape, mx.bfloat16), mx.zeros(shape[-1:], mx.bfloat16)]
    real = cp.records_of([(spec.build(spec.space(shape, "bfloat16")[0], "cuda", shape, "bfloat16"), inputs)])
    texts = ["", "a", "abcdefg", "abcdefgh", "abcdefghi", "x" * 1000 + "tail", cp.mlx_source(real[0])]
    out = subprocess.run([str(exe)], input="\0".join(texts) + "\0", capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == [f"{cp.std_hash(t.encode()):x}" for t in texts]


def test_source_follows_mlx_build_kernel() -> None:
    record = _record(_add_one("kf_t"))
    name = "custom_kernel_" + record.rendered.name + "_float_64"
    assert cp.kernel_name(record) == name
    source = cp.mlx_source(record)
    assert source.startswith('\n#include "mlx/backend/cuda/device/utils.cuh"\n\n'
                             '#include <cooperative_groups.h>\n\n')
    signature = (f"namespace mlx::core::cu {{\n\nnamespace cg = cooperative_groups;\n\n"
                 f"__global__ void {name}(\n"
                 "    const float* inp,\n    float* out) {\n  using T = float;\n  constexpr int N = 64;\n\n")
    assert signature in source
    assert source.index(record.rendered.header) < source.index(signature)
    assert source.endswith(record.rendered.source + "\n}\n\n} // namespace mlx::core::cu\n")
    assert cp.module_name(record) == f"{name}_{cp.std_hash(source.encode()):x}"


def test_shape_parameters_only_where_the_body_uses_them() -> None:
    src = KernelSource(name="kf_s", inputs=("inp",), outputs=("out",),
                       body="KF_UINT i = KF_GID; out[i] = inp[i * inp_strides[0]];")
    source = cp.mlx_source(_record(src))
    assert ("    const float* inp,\n    const __grid_constant__ Strides inp_strides,\n"
            "    float* out) {") in source
    assert "inp_shape," not in source and "inp_ndim," not in source


def test_long_module_names_split_like_mlx(tmp_path: Path) -> None:
    short = "m" * 245
    assert cp.ptx_path(tmp_path, short) == tmp_path / (short + ".ptx")
    long = "a" * 245 + "b" * 245 + "c" * 10
    assert cp.ptx_path(tmp_path, long) == tmp_path / ("a" * 245) / ("b" * 245) / ("c" * 10 + ".ptx")


def _cuda() -> bool:
    return CudaBackend().available()


def _arch() -> str:
    from kernelfleet.chips import detect_chip

    return str(detect_chip().arch)


@pytest.mark.cuda
def test_mlx_loads_the_file_written_under_our_module_name() -> None:
    """A decoy (same kernel name and signature, body writes 42) compiled and written under the real
    kernel's module name: MLX runs the decoy, so it read our file instead of compiling."""
    if not _cuda():
        pytest.skip("MLX CUDA backend not available on this machine")
    src = _add_one(f"kf_decoy_{uuid.uuid4().hex[:8]}")
    record = _record(src)
    real = cp.mlx_source(record)
    decoy = real.replace(record.rendered.source, "if (threadIdx.x + blockIdx.x * blockDim.x < N) {\n"
                                                 "  out[threadIdx.x + blockIdx.x * blockDim.x] = T(42);\n}")
    assert decoy != real
    kernel = f"mlx::core::cu::{cp.kernel_name(record)}"
    cubin, lowered = nvrtc.Compiler(cp.toolchain(_arch())).compile(nvrtc.Job("decoy", decoy, kernel))
    cp._write(cp.ptx_path(cp.cache_dir(), cp.module_name(record)), kernel, cubin, lowered)
    x = mx.arange(64, dtype=mx.float32)
    out = run(src, "cuda", [x], _launch(64), [(64,)], [mx.float32])
    assert np.array(out[0]).tolist() == [42.0] * 64


@pytest.mark.cuda
def test_precompiled_kernels_run_correctly() -> None:
    if not _cuda():
        pytest.skip("MLX CUDA backend not available on this machine")
    spec = get_spec("rmsnorm")
    shape = (33, 4096)
    inputs = spec.make_inputs(shape, "bfloat16", 0)
    configs = spec.space(shape, "bfloat16")[:4]
    records = cp.records_of([(spec.build(c, "cuda", shape, "bfloat16"), inputs) for c in configs])
    outcome = cp.precompile(records, _arch())
    assert not outcome.failed
    assert outcome.compiled + outcome.cached == len({cp.module_name(r) for r in records})
    for record in records:
        assert cp.ptx_path(cp.cache_dir(), cp.module_name(record)).exists()
    reference = spec.reference(inputs)[0]
    tol = spec.tolerances["bfloat16"]
    for config in configs:
        got = spec.build(config, "cuda", shape, "bfloat16")(inputs)[0]
        assert mx.allclose(got.astype(mx.float32), reference, atol=tol.atol, rtol=tol.rtol).item(), config


def test_without_cuda_mlx_the_tuner_compiles_at_first_launch() -> None:
    """Where MLX has no CUDA backend (this CPU build), precompiling says why not and changes nothing."""
    if _cuda():
        pytest.skip("MLX has its CUDA backend here")
    with pytest.raises(cp.NvrtcUnavailable):
        cp.toolchain("sm_90")
    spec = get_spec("rmsnorm")
    shape = (8, 4096)
    future = CudaBackend().precompile(spec, spec.space(shape, "float32")[:2], shape, "float32", 0)
    assert future is not None
    assert future.result().startswith("not precompiled: ")


def test_a_compile_process_that_cannot_start_refuses_its_jobs_and_is_replaced() -> None:
    """Every job gets an answer (a refusal naming why), none hangs, and no dead process is kept."""
    pool = nvrtc.CompilePool(nvrtc.Toolchain("/nonexistent/libnvrtc.so", ()), processes=2)
    try:
        results = pool.compile([nvrtc.Job(f"m{i}", "", "k") for i in range(3)])
        assert [r[0] for r in results] == ["m0", "m1", "m2"]
        assert all(cubin is None and "compile process ended" in why for _, cubin, why in results)
        assert pool.running() == 0
    finally:
        pool.close()


def _wheel_nvrtc() -> str | None:
    """libnvrtc from the nvidia-cuda-nvrtc wheel (a dev dependency on Linux x86-64): NVRTC is a
    compiler and needs no GPU."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(Path(root).glob("cu13/lib/libnvrtc.so*"))
        if found:
            return str(found[0])
    return None


TEMPLATE_KERNEL = """namespace kf { template <int N> __global__ void k(float* x) {
  int i = blockIdx.x * blockDim.x + threadIdx.x; x[i] += N + OFFSET; } }"""


@pytest.mark.skipif(_wheel_nvrtc() is None, reason="no nvidia-cuda-nvrtc wheel (pip install -e '.[dev]')")
def test_the_compile_pool_builds_cubins_with_the_real_nvrtc() -> None:
    """Real NVRTC in the pool's processes: every job answered in order, a cubin (ELF) and the lowered
    name of the name expression for the good ones, NVRTC's own log for the bad one."""
    chain = nvrtc.Toolchain(str(_wheel_nvrtc()), ("--gpu-architecture=sm_90a",))
    jobs = [nvrtc.Job(f"m{i}", TEMPLATE_KERNEL.replace("OFFSET", str(i)), "kf::k<4>") for i in range(5)]
    jobs.insert(2, nvrtc.Job("broken", "this is not C++", "kf::k<4>"))
    pool = nvrtc.CompilePool(chain, processes=3)
    try:
        results = pool.compile(jobs)
        assert [r[0] for r in results] == [j.module for j in jobs]
        for module, cubin, lowered in results:
            if module == "broken":
                assert cubin is None and "broken.cu(1): error" in lowered
            else:
                assert cubin is not None and cubin[:4] == b"\x7fELF"
                assert lowered == "_ZN2kf1kILi4EEEvPf"
        assert len({r[1] for r in results if r[1]}) == 5  # five sources, five different cubins
        assert pool.running() == 3  # the processes stay for the next call
        again = pool.compile(jobs[:1])
        assert again[0][1] == results[0][1]
        pool.close()
        assert pool.running() == 0
        assert pool.compile(jobs[:1])[0][1] == results[0][1]  # a closed pool starts processes again
    finally:
        pool.close()


@pytest.mark.skipif(_wheel_nvrtc() is None, reason="no nvidia-cuda-nvrtc wheel (pip install -e '.[dev]')")
def test_an_idle_compile_pool_lets_its_processes_go() -> None:
    chain = nvrtc.Toolchain(str(_wheel_nvrtc()), ("--gpu-architecture=sm_90a",))
    pool = nvrtc.CompilePool(chain, processes=2, idle_seconds=0.5)
    try:
        job = nvrtc.Job("m", TEMPLATE_KERNEL.replace("OFFSET", "0"), "kf::k<4>")
        assert pool.compile([job, job])[0][1] is not None
        assert pool.running() == 2
        deadline = time.monotonic() + 20
        while pool.running() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.running() == 0
        assert pool.compile([job])[0][1] is not None
    finally:
        pool.close()
