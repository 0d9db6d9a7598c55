#!/usr/bin/env python3
"""GPU workload run with and without the emulated `strict` sandbox: CUDA matmul, Triton JIT,
NCCL all-reduce through torch.distributed (world size 1), nvidia-smi. One line per check:
'OK <check> ...' or 'FAIL <check> ...'. Exit 0 only if every check passed."""
import os, sys, tempfile, time, traceback, socket, subprocess, platform

LABEL = os.environ.get("PROBE_LABEL", "?")
work = tempfile.mkdtemp(prefix=f"wl-{LABEL}-")
os.environ["TRITON_CACHE_DIR"] = os.path.join(work, "triton-cache")  # fresh: forces a real JIT compile
os.environ.setdefault("TRITON_HOME", work)
os.environ.setdefault("CUDA_CACHE_PATH", os.path.join(work, "nv-cache"))
os.environ.setdefault("NCCL_DEBUG", "INFO")
os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,ENV,ALLOC")
os.environ["NCCL_DEBUG_FILE"] = os.path.join(work, "nccl.%p.log")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

results = []


def say(s):
    print(f"[{LABEL}] {s}", flush=True)


def check(name):
    def deco(fn):
        t0 = time.time()
        try:
            detail = fn()
            results.append((name, True))
            say(f"OK {name} {detail or ''} ({time.time() - t0:.1f}s)")
        except BaseException as e:  # noqa: BLE001 - report everything
            results.append((name, False))
            tb = traceback.format_exc().strip().splitlines()
            say(f"FAIL {name}: {type(e).__name__}: {str(e)[:400]} ({time.time() - t0:.1f}s)")
            for line in tb[-8:]:
                say(f"   | {line}")
        return fn
    return deco


def proc_status():
    keys = ("Uid", "NoNewPrivs", "Seccomp", "Seccomp_filters", "CapEff", "CapBnd")
    out = []
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in keys:
            out.append(f"{k}={' '.join(v.split())}")
    return " ".join(out)


say(f"process {proc_status()}")
say(f"python {platform.python_version()} {sys.executable} glibc {platform.libc_ver()[1]} kernel {platform.release()}")

import torch  # noqa: E402
say(f"torch {torch.__version__} cuda {torch.version.cuda} device {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'NONE'}")


@check("cuda_matmul")
def _():
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2048, 2048, generator=g)
    b = torch.randn(2048, 2048, generator=g)
    ref = a.double() @ b.double()
    got = (a.cuda() @ b.cuda()).cpu().double()
    err = (got - ref).abs().max().item()
    assert err < 1e-2, f"max abs err {err}"
    hb = (a.cuda().bfloat16() @ b.cuda().bfloat16()).float().cpu().double()
    rel = ((hb - ref).norm() / ref.norm()).item()
    assert rel < 2e-2, f"bf16 rel err {rel}"
    torch.cuda.synchronize()
    return f"fp32 2048^3 max|err|={err:.2e} bf16 rel={rel:.2e}"


@check("triton_jit")
def _():
    import triton
    import triton.language as tl
    say(f"triton {triton.__version__} cache {os.environ['TRITON_CACHE_DIR']}")

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(axis=0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, x * 2.0 + y, mask=mask)

    n = 98_765
    x = torch.rand(n, device="cuda")
    y = torch.rand(n, device="cuda")
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    torch.cuda.synchronize()
    err = (out - (2 * x + y)).abs().max().item()
    assert err == 0.0, f"max abs err {err}"
    files = [f for _, _, fs in os.walk(os.environ["TRITON_CACHE_DIR"]) for f in fs]
    assert any(f.endswith(".cubin") for f in files), f"no cubin in fresh cache: {files[:10]}"
    return f"vector add n={n} exact, fresh cache holds {len(files)} files incl. cubin"


@check("nccl_allreduce")
def _():
    import torch.distributed as dist
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0,
                            device_id=torch.device("cuda", 0))
    try:
        t = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        big = torch.full((64 << 20,), 1.5, device="cuda", dtype=torch.bfloat16)  # 128 MiB
        dist.all_reduce(big)
        dist.barrier()
        torch.cuda.synchronize()
        assert torch.equal(t, torch.arange(1 << 20, device="cuda", dtype=torch.float32)), "small all_reduce wrong"
        assert bool((big == 1.5).all()), "big all_reduce wrong"
        v = torch.cuda.nccl.version()
    finally:
        dist.destroy_process_group()
    return f"world_size=1 NCCL {'.'.join(map(str, v)) if isinstance(v, tuple) else v} 4 MiB fp32 + 128 MiB bf16 sums exact"


# ---- extras beyond the three required checks (SGLang also uses CUDA graphs, NVRTC via DeepGEMM,
# and nvcc subprocesses via FlashInfer's JIT)
@check("extra_cuda_graph")
def _():
    x = torch.zeros(1 << 16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            y = x * 2 + 1
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x * 2 + 1
    x.fill_(3.0)
    g.replay()
    torch.cuda.synchronize()
    assert bool((y == 7.0).all()), "graph replay wrong"
    return "capture + replay exact"


@check("extra_nvrtc_jiterator")
def _():
    code = "template <typename T> T fma_k(T x, T y, T alpha) { return -x + alpha * y; }"
    fn = torch.cuda.jiterator._create_jit_fn(code, alpha=1.0)
    a = torch.rand(4096, device="cuda")
    b = torch.rand(4096, device="cuda")
    out = fn(a, b, alpha=3.0)
    err = (out - (-a + 3.0 * b)).abs().max().item()
    assert err < 1e-5, f"err {err}"
    return f"NVRTC-compiled elementwise kernel max|err|={err:.1e}"


@check("extra_nvcc_subprocess")
def _():
    import shutil
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    assert os.path.exists(nvcc), "nvcc not found"
    src = os.path.join(work, "k.cu")
    open(src, "w").write(r"""
#include <cstdio>
__global__ void k(int *o) { o[threadIdx.x] = threadIdx.x * 3; }
int main() { int *d, h[64]; cudaMalloc(&d, sizeof h); k<<<1, 64>>>(d);
  cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  for (int i = 0; i < 64; i++) if (h[i] != i * 3) { printf("bad\n"); return 1; }
  printf("ok\n"); return 0; }
""")
    exe = os.path.join(work, "k")
    r = subprocess.run([nvcc, "-arch=sm_90", "-o", exe, src], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"nvcc rc={r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}"
    r = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", f"rc={r.returncode} {r.stdout.strip()} {r.stderr.strip()[-300:]}"
    return f"{nvcc} built and ran a CUDA C++ program"


@check("nvidia_smi")
def _():
    r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"rc={r.returncode} {r.stderr.strip()[:300]} {r.stdout.strip()[:300]}"
    return r.stdout.strip()


# NCCL's own log: warnings and silent fallbacks (compare with the control run)
logs = [os.path.join(work, f) for f in os.listdir(work) if f.startswith("nccl.")]
lines = []
for p in logs:
    lines += open(p, errors="replace").read().splitlines()
say(f"nccl log: {len(lines)} lines")
for line in lines:
    l = line.lower()
    if any(k in l for k in ("warn", "fail", "falling back", "not permitted", "error", "disabl", "cumem", "version", "using network", "channel", "p2p", "shm")):
        say(f"   nccl| {line.split('NCCL ', 1)[-1][:220]}")
bad = [n for n, ok in results if not ok]
say(f"SUMMARY {'ALL_OK' if not bad else 'FAILED ' + ','.join(bad)} {proc_status()}")
sys.exit(1 if bad else 0)
