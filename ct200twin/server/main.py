"""The SGLang twin server's process: ``python -m ct200twin.server.main <argv of sglang.launch_server>``.

Behaves like SGLang 0.5.23 from the outside: the port refuses connections while "weights load",
a simulated CUDA-graph capture can OOM, then the HTTP server binds, ``/health`` answers 503 until
the warmup generation ends and then runs a 1-token generation per call.  Here: the startup
phases (a multi-node rendezvous, weight load, KV cache, graph capture, bind, warmup) and
``main`` (argv, knob file, signals).  What the start works out: :mod:`.resolved`; the
endpoints: :mod:`.http_api`; tokens in wall time: :mod:`.engine`; log lines: :mod:`.logs`;
knobs: :mod:`.faults`.  See docs/twin.md.

Tests and benchmarks import ``LocalTwin``, ``nvfp4_ctx8k_argv`` and ``free_port`` (from
:mod:`.local_twin`) from here.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import sys
import time

if __name__ == "__main__":  # a SIGTERM while still importing: clean exit, as later
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))

from aiohttp import web  # noqa: E402

from ct200twin.server import args as targs  # noqa: E402
from ct200twin.server.faults import FaultFileError, load_faults  # noqa: E402
from ct200twin.server.gpu_hold import GpuHold, server_gpus  # noqa: E402
from ct200twin.server.http_api import TwinServer  # noqa: E402
from ct200twin.server.local_twin import LocalTwin, free_port, nvfp4_ctx8k_argv  # noqa: E402
from ct200twin.server.logs import _SG, Log, StartupFailure, _traceback  # noqa: E402
from ct200twin.server.memory import KVCacheError, plan_memory  # noqa: E402
from dsv4deploy.profile.memory_facts import CUDA_CONTEXT_GIB as CUDA_CTX, WEIGHTS_TOTAL_GIB, weights_per_gpu_gib  # noqa: E402
from ct200twin.server.resolved import Resolved, _mem_inputs, resolve  # noqa: E402

__all__ = ["LocalTwin", "free_port", "main", "nvfp4_ctx8k_argv", "run_server", "run_worker_rank"]


# ----------------------------------------------------------------------------- startup phases
def ranks_here(res: Resolved) -> int:
    """The ranks (one GPU each) this node runs: tp * pp * dp over the nodes."""
    a = res.args.ns
    return a.tp_size * (a.pp_size or 1) * (a.dp_size or 1) // max(1, a.nnodes or 1)


def gpu_hold(res: Resolved) -> GpuHold:
    """Where this server's GPU memory shows in the twin's nvidia-smi (gpu_hold.py): its ranks'
    GPUs as --base-gpu-id, --gpu-id-step and CUDA_VISIBLE_DEVICES give them."""
    a = res.args.ns
    step = getattr(a, "gpu_id_step", None)
    step = step[0] if isinstance(step, list) and step else step
    try:
        step = int(step) if step not in (None, True) else 1
    except (TypeError, ValueError):
        step = 1
    return GpuHold(server_gpus(ranks_here(res), res.gpu_count, a.base_gpu_id or 0, step,
                               os.environ.get("CUDA_VISIBLE_DEVICES")))


def _serving_gib(res: Resolved) -> float:
    """What a started server holds per GPU: the CUDA context, weights and KV pool (the static
    share), and the decode graphs (nvidia-smi shows capacity minus SGLang's available_gpu_mem)."""
    mem = res.mem
    return CUDA_CTX + (mem.static_gib + mem.graph_reserve_gib if mem is not None else 0.0)


def _fmt_args(res: Resolved) -> str:
    d = res.server_args_dict()
    return "ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in d.items()) + ")"


async def _rendezvous_rank0(res: Resolved, log: Log) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    a = res.args.ns
    host, _, port = (a.dist_init_addr or "").rpartition(":")
    need = (a.nnodes or 1) - 1
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    got = asyncio.Event()

    async def on_conn(reader, writer):
        conns.append((reader, writer))
        if len(conns) >= need:
            got.set()

    try:
        srv = await asyncio.start_server(on_conn, host or "0.0.0.0", int(port))
    except (OSError, ValueError) as e:
        log.raw(f"RuntimeError: torch.distributed TCPStore failed to bind {a.dist_init_addr}: {e}")
        raise StartupFailure(1)
    log.info(f"Init torch distributed begin. (waiting for {need} node(s) at {a.dist_init_addr})", tp=True)
    timeout = a.dist_timeout or 600
    try:
        await asyncio.wait_for(got.wait(), timeout)
    except asyncio.TimeoutError:
        log.raw(f"torch.distributed.DistStoreError: Timed out after {timeout} seconds waiting for clients. "
                f"{len(conns) + 1}/{need + 1} clients joined.")
        raise StartupFailure(1)
    srv.close()
    log.info("Init torch distributed ends.", tp=True)
    return conns


async def _rendezvous_worker(res: Resolved, log: Log) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    a = res.args.ns
    host, _, port = (a.dist_init_addr or "").rpartition(":")
    timeout = a.dist_timeout or 600
    t0 = time.monotonic()
    log.info(f"Init torch distributed begin. (connecting to rank 0 at {a.dist_init_addr})", tp=True)
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            log.info("Init torch distributed ends.", tp=True)
            return reader, writer
        except (OSError, ValueError):
            if time.monotonic() - t0 > timeout:
                log.raw(f"torch.distributed.DistNetworkError: failed to connect to {a.dist_init_addr} "
                        f"after {timeout} seconds")
                raise StartupFailure(1)
            await asyncio.sleep(0.5)


async def _bind(app_runner: web.AppRunner, host: str, port: int, log: Log) -> None:
    site = web.TCPSite(app_runner, host, port)
    try:
        await site.start()
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            log.raw(f"ERROR:    [Errno 98] error while attempting to bind on address ('{host}', {port}): "
                    "address already in use")
        else:
            log.raw(f"ERROR:    [Errno {e.errno}] error while attempting to bind on address ('{host}', {port}): "
                    f"{e.strerror}")
        raise StartupFailure(1)
    log.info(f"Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")


async def run_worker_rank(res: Resolved, log: Log, hold: GpuHold | None = None) -> int:
    """node_rank >= 1 of a multi-node run: dummy health server; on SIGTERM waits for rank 0."""
    a = res.args.ns
    hold = hold or GpuHold([])
    hold.hold(CUDA_CTX)
    reader, writer = await _rendezvous_worker(res, log)
    await asyncio.sleep(res.faults.load_seconds)
    hold.hold(_serving_gib(res))
    app = web.Application()

    async def ok(request):
        return web.Response(status=200)

    app.router.add_get("/health", ok)
    app.router.add_get("/health_generate", ok)
    app.router.add_get("/ping", ok)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await _bind(runner, a.host, a.port, log)
    log.info(f"Node rank {a.node_rank} is ready; serving a dummy health check on {a.host}:{a.port}")
    await reader.read()  # returns at EOF: rank 0 went away (its ShutdownReq broadcast)
    log.info("Received ShutdownReq from rank 0; exiting.", tp=True)
    writer.close()
    await runner.cleanup()
    return 0


async def run_server(res: Resolved, log: Log, stale: bool = False, hold: GpuHold | None = None) -> int:
    """Rank 0's start, phase by phase (HOLD: the GPU memory each phase holds, for nvidia-smi)."""
    a = res.args.ns
    f = res.faults
    mem = res.mem
    hold = hold or GpuHold([])
    peers: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    if stale:
        hold.hold(_serving_gib(res))
    else:
        log.info(f"server_args={_fmt_args(res)}")
        gpus_needed = ranks_here(res)
        if gpus_needed + (a.base_gpu_id or 0) > res.gpu_count:
            await asyncio.sleep(min(1.0, f.load_seconds))
            log.raw(_traceback([(f"{_SG}/model_executor/model_runner.py", 512, "init_torch_distributed",
                                 "torch.get_device_module(self.device).set_device(self.gpu_id)")],
                               f"torch.AcceleratorError: CUDA error: invalid device ordinal (this node has "
                               f"{res.gpu_count} GPU(s); tp*pp*dp/nnodes = {gpus_needed} needed)"))
            raise StartupFailure(1)
        hold.hold(CUDA_CTX)
        if (a.nnodes or 1) > 1:
            if not a.dist_init_addr:
                log.raw("ValueError: --dist-init-addr is required when --nnodes > 1")
                raise StartupFailure(1)
            peers = await _rendezvous_rank0(res, log)
        cap = res.gpu_mem_mib / 1024
        log.info(f"Load weight begin. avail mem={cap - CUDA_CTX:.2f} GB", tp=True)
        await asyncio.sleep(f.load_seconds * 0.8)
        if mem is None:  # the weights leave no KV pool: SGLang finds out right after loading
            try:
                plan_memory(_mem_inputs(res.args, res.gpu_mem_mib, res.max_running_requests,
                                        res.graphs_enabled, f))
                err = "the weights leave no GPU memory for the KV cache"
            except KVCacheError as e:
                err = str(e)
            weights = weights_per_gpu_gib(a.tp_size, a.pp_size or 1, f.weights_gib or WEIGHTS_TOTAL_GIB)
            hold.hold(CUDA_CTX + weights)
            log.info(f"Load weight end. elapsed={f.load_seconds * 0.8:.2f} s, type={res.model.architectures[0]}, "
                     f"avail mem={max(cap - CUDA_CTX - weights, 0):.2f} GB, mem usage={weights:.2f} GB.", tp=True)
            log.raw("Scheduler hit an exception: " + _traceback(
                [(f"{_SG}/managers/scheduler.py", 3110, "run_scheduler_process", "scheduler = Scheduler("),
                 (f"{_SG}/mem_cache/kv_cache_configurator.py", 141, "_profile_available_bytes",
                  "raise ValueError(")], f"ValueError: {err}"))
            log.error("Received sigquit from a child process. It usually means the child failed.")
            raise StartupFailure(1)
        log.info(f"Load weight end. elapsed={f.load_seconds * 0.8:.2f} s, type={res.model.architectures[0]}, "
                 f"avail mem={cap - CUDA_CTX - mem.weights_gib:.2f} GB, mem usage={mem.weights_gib:.2f} GB.", tp=True)
        hold.hold(CUDA_CTX + mem.static_gib)
        log.info(f"KV Cache is allocated. #tokens: {mem.max_total_num_tokens}, "
                 f"KV size: {mem.kv_pool_gib:.2f} GB", tp=True)
        log.info(f"Memory pool end. avail mem={mem.headroom_gib:.2f} GB", tp=True)
        if mem.graph_bs:
            log.info(f"Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
                     f"avail mem={mem.headroom_gib:.2f} GB", tp=True)
            await asyncio.sleep(f.load_seconds * 0.2)
            if mem.oom is not None:
                o = mem.oom
                total = mem.capacity_gib
                free = o.free_gib
                in_use = total - free
                log.raw("Scheduler hit an exception: " + _traceback(
                    [(f"{_SG}/managers/scheduler.py", 3110, "run_scheduler_process", "scheduler = Scheduler("),
                     (f"{_SG}/model_executor/model_runner.py", 2011, "init_device_graphs",
                      "self.graph_runner = graph_runners[self.device](self)"),
                     (f"{_SG}/model_executor/cuda_graph_runner.py", 468, "capture", "self.capture_one_batch_size(bs, forward)"),
                     ("/opt/sglang/lib/python3.11/site-packages/torch/cuda/graphs.py", 186, "capture_end",
                      "self.cuda_graph.capture_end()")],
                    f"Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate {o.tried_gib:.2f} GiB. "
                    f"GPU 0 has a total capacity of {total:.2f} GiB of which {free:.2f} GiB is free. "
                    f"Including non-PyTorch memory, this process has {in_use:.2f} GiB memory in use. Of the "
                    f"allocated memory {in_use - CUDA_CTX:.2f} GiB is allocated by PyTorch, and 0.00 GiB is "
                    "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
                    "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
                    "documentation for Memory Management  "
                    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n"
                    "Possible solutions:\n"
                    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
                    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
                    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
                    "(Not recommended. Huge performance loss)\n"
                    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose "))
                log.error("Received sigquit from a child process. It usually means the child failed.")
                raise StartupFailure(1)
            hold.hold(_serving_gib(res))
            log.info(f"Capture target decode CUDA graph end. bs={mem.graph_bs}, elapsed={f.load_seconds * 0.2:.2f} s, "
                     f"mem usage={mem.graph_reserve_gib:.2f} GB, avail mem={mem.available_after_gib:.2f} GB.",
                     tp=True)
        else:
            await asyncio.sleep(f.load_seconds * 0.2)
        log.info(f"max_total_num_tokens={mem.max_total_num_tokens}, chunked_prefill_size={res.chunked_prefill_size}, "
                 f"max_prefill_tokens={res.max_prefill_tokens}, max_running_requests={res.max_running_requests}, "
                 f"context_len={res.context_len}, available_gpu_mem={mem.available_after_gib:.2f} GB", tp=True)
        if f.crash_on_start:
            why = f.crash_on_start if isinstance(f.crash_on_start, str) else \
                "RuntimeError: CUDA error: unspecified launch failure (twin fault: crash_on_start)"
            log.raw("Scheduler hit an exception: " + _traceback(
                [(f"{_SG}/managers/scheduler.py", 3110, "run_scheduler_process", "scheduler = Scheduler(")], why))
            log.error("Received sigquit from a child process. It usually means the child failed.")
            raise StartupFailure(1)
    server = TwinServer(res, log, stale=stale)
    runner = web.AppRunner(server.make_app(), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    server.engine.start()
    await _bind(runner, a.host, a.port, log)
    for target in f.connect_probe:
        await _connect_probe(target, log)
    watchers = [asyncio.ensure_future(_watch_peer(r, log)) for r, _w in peers]
    try:
        if stale:
            server.status = "Up"
            log.info("The server is fired up and ready to roll!")
        else:
            await server.warmup()
        await asyncio.Event().wait()
    finally:
        for w in watchers:
            w.cancel()
        for _r, w in peers:
            w.close()
        await runner.cleanup()
    return 0


async def _connect_probe(target: str, log: Log) -> None:
    """The `connect_probe` knob: one TCP connect from this process (so from inside its unit's
    cgroup and IP rules) to TARGET, its outcome logged."""
    host, _, port = target.rpartition(":")
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 2.0)
        writer.close()
        outcome = "connected"
    except asyncio.TimeoutError:
        outcome = "timed out"
    except OSError as e:
        outcome = f"{errno.errorcode.get(e.errno, e.errno)} ({e.strerror})"
    log.info(f"twin: connect_probe {target}: {outcome}")


async def _watch_peer(reader: asyncio.StreamReader, log: Log) -> None:
    """Rank 0: a worker node going away breaks NCCL; the real server dies with it."""
    await reader.read()
    log.raw("torch.distributed.DistBackendError: NCCL error: remote process exited or there was a "
            "network error (a worker node went away)")
    log.error("Received sigquit from a child process. It usually means the child failed.")
    os._exit(1)


# ------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        pa = targs.parse_args(argv)
    except targs.TwinArgError as e:
        print(f"sglang serve: error: {e}", file=sys.stderr)
        return 2
    log = Log(pa.ns.log_level)
    try:
        faults = load_faults(argv=list(argv))
    except FaultFileError as e:
        log.error(f"twin fault file: {e}")
        return 1
    stale = bool(faults.stale_model_path)
    try:
        res = resolve(pa, faults, log, stale=stale)
    except StartupFailure as e:
        return e.code
    worker = (pa.ns.nnodes or 1) > 1 and (pa.ns.node_rank or 0) >= 1
    hold = gpu_hold(res)

    async def amain() -> int:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        state = {"term": False}

        def on_term(signame: str) -> None:
            if worker:
                log.info(f"Received {signame}; node_rank={pa.ns.node_rank} is waiting for the rank-0 "
                         "ShutdownReq broadcast (the orchestrator's kill timeout is the backstop).")
                return
            if not state["term"]:
                state["term"] = True
                log.info(f"Received {signame}. Shutting down the server.")
                task.cancel()

        loop.add_signal_handler(signal.SIGTERM, on_term, "SIGTERM")
        loop.add_signal_handler(signal.SIGINT, on_term, "SIGINT")
        try:
            if worker:
                return await run_worker_rank(res, log, hold=hold)
            return await run_server(res, log, stale=stale, hold=hold)
        except asyncio.CancelledError:
            return 0
        except StartupFailure as e:
            return e.code

    try:
        code = asyncio.run(amain())
    finally:
        hold.release()
    sys.stderr.flush()
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
