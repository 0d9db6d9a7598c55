"""SGLang 0.5.23's HTTP API, as the twin serves it (aiohttp): ``/health`` (a 1-token generation),
``/ready``, model and server info, ``/generate``, the OpenAI completions, ``/metrics``, the API
key, and the faults that show there (error rate, crash after N requests, never healthy).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import time
import uuid
from typing import Any

from aiohttp import web

from dsv4deploy.sglang.patches import MASK
from ct200twin.server import args as targs
from ct200twin.server.engine import Engine, ReqGroup, _seed
from ct200twin.server.vocab import count_text_tokens
from ct200twin.server.logs import _SG, SECRET_FIELDS, Log, _traceback, secrets_masked
from ct200twin.server.perf import Req
from ct200twin.server.resolved import Resolved
from ct200twin.server.sickness import Sickness

HEALTH_PREFIXES = ("/health", "/ready", "/metrics")
# SGLang 0.5.23's ADMIN_OPTIONAL endpoints that the twin serves: with --admin-api-key they take
# only that key (the API key is refused), without it the API key (srt/utils/auth.py)
ADMIN_PATHS = ("/flush_cache",)


class HTTPError(Exception):
    def __init__(self, status: int, message: str, etype: str = "BadRequestError"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.etype = etype


class TwinServer:
    """SGLang's HTTP API over one ``Resolved`` start and its ``Engine`` (``make_app``)."""

    def __init__(self, res: Resolved, log: Log, stale: bool = False):
        self.res = res
        self.log = log
        self.stale = stale
        self.status = "Starting"  # Starting | Up | UnHealthy
        self.engine = Engine(res.perf_config(), log, res.args.decode_log_interval or 40,
                             res.mem.cuda_graph_max_bs if (res.mem and res.graphs_enabled) else 0)
        self.sick = Sickness()      # switched on and off while it runs (sickness.py)
        self.engine.sick = self.sick
        self.user_requests = 0      # user generations received (error_rate index)
        self.completed_user = 0     # user generations completed (crash_after_requests)
        self.started_at = time.time()
        self.startup_time = 0.0
        self.crashing = False
        self.api_key = res.args.api_key
        self.admin_api_key = res.args.admin_api_key
        self.ready_endpoint = targs.has_ready_endpoint(res.args.version)

    # ------------------------------------------------------------------ app
    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth_mw], client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        if self.ready_endpoint:
            r.add_get("/ready", self.ready)
        r.add_get("/model_info", self.model_info)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/v1/models/{model:.+}", self.model_one)
        r.add_post("/generate", self.generate)
        r.add_put("/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_route("GET", "/flush_cache", self.flush_cache)
        r.add_route("POST", "/flush_cache", self.flush_cache)
        r.add_get("/ping", self.ping)
        if self.res.args.enable_metrics:
            r.add_get("/metrics", self.metrics)
        return app

    @web.middleware
    async def _auth_mw(self, request: web.Request, handler):
        admin = request.path in ADMIN_PATHS and self.admin_api_key
        key = self.admin_api_key if admin else self.api_key
        if key and not request.path.startswith(HEALTH_PREFIXES):
            auth = request.headers.get("Authorization", "")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
                return web.json_response({"error": "Unauthorized"}, status=401)
        try:
            return await handler(request)
        except HTTPError as e:
            return web.json_response({"error": {"message": e.message, "type": e.etype, "code": e.status}},
                                     status=e.status)

    # ------------------------------------------------------------------ helpers
    def _check_len(self, input_len: int, max_new: int) -> None:
        ctx = self.res.context_len
        if input_len >= ctx:
            raise HTTPError(400, f"The input ({input_len} tokens) is longer than the model's context "
                                 f"length ({ctx} tokens).")
        if input_len + max_new > ctx:
            raise HTTPError(400, f"Requested token count exceeds the model's maximum context length of "
                                 f"{ctx} tokens. You requested a total of {input_len + max_new} tokens: "
                                 f"{input_len} tokens from the input messages and {max_new} tokens for the "
                                 f"completion. Please reduce the number of tokens in the input messages or "
                                 f"the completion to fit within the limit.")

    def _make_req(self, group: ReqGroup, input_len: int, max_new: int, seed: int) -> Req:
        self._check_len(input_len, max_new)
        n = self.user_requests
        self.user_requests += 1
        fail_at = None
        if self.res.faults.fails(n) or self.sick.errors():
            fail_at = max(1, max_new // 2)
        req = Req(rid=uuid.uuid4().hex, input_len=input_len, max_new_tokens=max_new, fail_at=fail_at)
        group.add(req, seed)
        return req

    async def _unless_hung(self) -> None:
        """While the twin is sick with `hang` (sickness.py), a user generation waits."""
        while self.sick.hangs():
            await asyncio.sleep(0.2)

    def _submit_group(self, group: ReqGroup) -> None:
        for r in group.reqs:
            self.engine.submit(r)

    def _user_done(self, n: int = 1) -> None:
        self.completed_user += n
        limit = self.res.faults.crash_after_requests
        if limit is not None and self.completed_user >= limit and not self.crashing:
            self.crashing = True
            asyncio.get_running_loop().call_later(0.2, self._crash_now)

    def _crash_now(self) -> None:
        self.log.error("Scheduler hit an exception: " + _traceback(
            [(f"{_SG}/managers/scheduler.py", 3110, "run_scheduler_process", "scheduler.event_loop_overlap()"),
             (f"{_SG}/model_executor/model_runner.py", 2398, "forward", "return self.forward_decode(")],
            "RuntimeError: CUDA error: an illegal memory access was encountered "
            f"(twin fault: crash_after_requests={self.res.faults.crash_after_requests})"), tp=True)
        self.log.error("Received sigquit from a child process. It usually means the child failed.")
        os._exit(1)

    @staticmethod
    async def _json(request: web.Request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
            raise HTTPError(400, "Invalid JSON body") from None
        if not isinstance(body, (dict, list)):
            raise HTTPError(400, "Request body must be a JSON object")
        return body

    async def _finish_group(self, group: ReqGroup) -> None:
        """A non-streamed request's end: wait for every request of GROUP (what is unfinished is
        aborted, whatever ends the wait), count them done, and answer 500 if one failed."""
        try:
            await self._wait_group(group)
        finally:
            group.abort_unfinished()
        self._user_done(len(group.reqs))
        if any(r.failed for r in group.reqs):
            raise HTTPError(500, self._fault_message(), "InternalServerError")

    async def _wait_group(self, group: ReqGroup) -> None:
        while not all(r.finished for r in group.reqs):
            await group.event.wait()
            group.event.clear()

    # ------------------------------------------------------------------ health
    async def health(self, request: web.Request) -> web.Response:
        if self.status == "Starting" or self.res.faults.never_healthy:
            return web.Response(status=503)
        if self.stale:
            return web.Response(status=200)
        if request.path == "/health" and os.environ.get(
                "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true").lower() in ("0", "false", "no"):
            return web.Response(status=200)
        timeout = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        poll = self.res.faults.health_poll_seconds
        req = Req(rid="HEALTH_CHECK_" + uuid.uuid4().hex[:8], input_len=1, max_new_tokens=1, internal=True)
        self.engine.submit(req)
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < timeout:
                await asyncio.sleep(poll)
                if req.generated > 0:
                    return web.Response(status=200)
        finally:
            if not req.finished:
                req.aborted = True
        self.log.error(f"Health check failed. Server couldn't get a response from detokenizer for last "
                       f"{timeout} seconds.")
        self.status = "UnHealthy"
        return web.Response(status=503)

    async def ready(self, request: web.Request) -> web.Response:
        ok = self.status == "Up" and not self.res.faults.never_healthy
        return web.Response(status=200 if ok else 503)

    async def ping(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    # ------------------------------------------------------------------ info
    def _model_info(self) -> dict:
        m = self.res.model
        return {
            "model_path": self.res.model_path,
            "served_model_name": self.res.served_model_name,
            "tokenizer_path": self.res.args.tokenizer_path or self.res.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": m.model_type,
            "architectures": m.architectures,
        }

    async def model_info(self, request: web.Request) -> web.Response:
        if request.path == "/get_model_info":
            self.log.warning("Endpoint '/get_model_info' is deprecated and will be removed in a future "
                             "version. Please use '/model_info' instead.")
        return web.json_response(self._model_info())

    def _launch_command(self) -> str:
        """As SGLang 0.5.23 builds it: the args after --config merging, without the program
        (so a key from the config file shows, unless the mask patch is in)."""
        argv = list(self.res.args.merged_argv)
        if self.stale:
            argv = [self.res.model_path if (i > 0 and argv[i - 1] in ("--model-path", "--model")) else a
                    for i, a in enumerate(argv)]
        if secrets_masked():
            flags = {f"--{k.replace('_', '-')}" for k in SECRET_FIELDS}
            argv = [MASK if i > 0 and argv[i - 1] in flags else
                    (a.split("=", 1)[0] + "=" + MASK if a.split("=", 1)[0] in flags and "=" in a else a)
                    for i, a in enumerate(argv)]
        return " ".join(argv)

    async def server_info(self, request: web.Request) -> web.Response:
        res = self.res
        info = res.server_args_dict()
        mem = res.mem
        info.update({
            "launch_command": self._launch_command(),
            "max_total_num_tokens": mem.max_total_num_tokens if mem else None,
            "max_req_input_len": res.context_len - 1,
            "startup_time": self.startup_time,
            "internal_states": [{
                "last_gen_throughput": self.engine.gen_throughput,
                "memory_usage": {"weight": round(mem.weights_gib, 2) if mem else None,
                                 "kvcache": round(mem.kv_pool_gib, 2) if mem else None,
                                 "graph": round(mem.graph_reserve_gib, 2) if mem else None},
                "max_total_num_tokens": mem.max_total_num_tokens if mem else None,
            }],
            "version": res.args.version,
            "frontend": "python",
            "pid": os.getpid(),
            "status": self.status,
            "twin": {"emulates": f"sglang {res.args.version}", "stale": self.stale,
                     "faults_file": res.faults.source, "gpu_memory_mib": res.gpu_mem_mib,
                     "gpu_count": res.gpu_count,
                     "allreduce": mem.allreduce if mem else None},
        })
        return web.json_response(info)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card()]})

    def _model_card(self) -> dict:
        return {"id": self.res.served_model_name, "object": "model", "created": int(self.started_at),
                "owned_by": "sglang", "root": self.res.model_path, "parent": None,
                "max_model_len": self.res.context_len}

    async def model_one(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name != self.res.served_model_name:
            return web.json_response({"error": {"message": f"The model '{name}' does not exist",
                                                "type": "NotFoundError", "code": "model_not_found"}},
                                     status=404)
        return web.json_response(self._model_card())

    async def flush_cache(self, request: web.Request) -> web.Response:
        ok = self.engine.sched.idle()
        self.log.info("Cache flushed successfully!" if ok else
                      "Cache not flushed because there are pending requests.", tp=True)
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. (When there are running or "
                 "waiting requests, the operation will not be performed.)\n", status=200 if ok else 400)

    # ------------------------------------------------------------------ metrics
    async def metrics(self, request: web.Request) -> web.Response:
        e = self.engine
        s = e.sched
        lbl = '{model_name="%s",engine_type="unified",tp_rank="0",pp_rank="0"}' % self.res.served_model_name
        mem = self.res.mem
        out: list[str] = []

        def metric(name, typ, help_, value):
            out.append(f"# HELP sglang:{name} {help_}")
            out.append(f"# TYPE sglang:{name} {typ}")
            out.append(f"sglang:{name}{lbl} {float(value)}")

        metric("num_running_reqs", "gauge", "The number of running requests.", len(s.running))
        metric("num_queue_reqs", "gauge", "The number of requests in the waiting queue.", len(s.waiting))
        metric("num_used_tokens", "gauge", "The number of used tokens.", s.kv_used)
        metric("token_usage", "gauge", "The token usage.", e.token_usage())
        metric("gen_throughput", "gauge", "The generation throughput (token/s).", e.gen_throughput)
        metric("cache_hit_rate", "gauge", "The prefix cache hit rate.", 0.0)
        metric("num_retracted_reqs", "gauge", "The number of retracted requests.", 0)
        metric("max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV pool.",
               mem.max_total_num_tokens if mem else 0)
        metric("weight_memory_usage_gb", "gauge", "Weight memory usage (GB).", mem.weights_gib if mem else 0)
        metric("kv_cache_memory_usage_gb", "gauge", "KV cache memory usage (GB).", mem.kv_pool_gib if mem else 0)
        metric("startup_time_seconds", "gauge", "Server startup time (s).", self.startup_time)
        metric("prompt_tokens_total", "counter", "Number of prefill tokens processed.", s.prompt_tokens)
        metric("generation_tokens_total", "counter", "Number of generation tokens processed.", s.generated_tokens)
        metric("num_requests_total", "counter", "Number of requests processed.", self.completed_user)
        for name, help_, values in (
                ("time_to_first_token_seconds", "Histogram of time to first token in seconds.", e.ttft),
                ("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", e.e2e)):
            buckets = [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300, 600, 1200]
            out.append(f"# HELP sglang:{name} {help_}")
            out.append(f"# TYPE sglang:{name} histogram")
            base = lbl[1:-1]
            for b in buckets:
                cnt = sum(1 for v in values if v <= b)
                out.append(f'sglang:{name}_bucket{{{base},le="{float(b)}"}} {float(cnt)}')
            out.append(f'sglang:{name}_bucket{{{base},le="+Inf"}} {float(len(values))}')
            out.append(f"sglang:{name}_count{lbl} {float(len(values))}")
            out.append(f"sglang:{name}_sum{lbl} {float(sum(values))}")
        return web.Response(text="\n".join(out) + "\n", content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    # ------------------------------------------------------------------ /generate
    def _parse_generate(self, body: dict) -> tuple[ReqGroup, bool, bool]:
        sp = body.get("sampling_params") or {}
        if isinstance(sp, list):
            sp = sp[0] if sp else {}
        max_new = sp.get("max_new_tokens")
        max_new = 128 if max_new is None else int(max_new)
        if max_new < 0:
            raise HTTPError(400, "max_new_tokens must be at least 0")
        text = body.get("text")
        input_ids = body.get("input_ids")
        group = ReqGroup()
        prompts: list[tuple[int, int]] = []
        if input_ids is not None:
            if input_ids and isinstance(input_ids[0], list):
                prompts = [(len(x), _seed(x)) for x in input_ids]
                batched = True
            else:
                prompts = [(len(input_ids), _seed(input_ids))]
                batched = False
        elif text is not None:
            if isinstance(text, list):
                prompts = [(count_text_tokens(t), _seed(t)) for t in text]
                batched = True
            else:
                prompts = [(count_text_tokens(str(text)), _seed(text))]
                batched = False
        else:
            raise HTTPError(400, "Either text, input_ids or input_embeds should be provided.")
        for n, seed in prompts:
            self._make_req(group, max(1, n), max_new, seed)
        return group, bool(body.get("stream")), batched

    def _meta(self, group: ReqGroup, i: int) -> dict:
        r = group.reqs[i]
        meta: dict[str, Any] = {
            "id": r.rid,
            "finish_reason": None,
            "prompt_tokens": r.input_len,
            "weight_version": "default",
            "total_retractions": 0,
            "completion_tokens": r.generated,
            "cached_tokens": 0,
        }
        if r.finished and not r.failed:
            meta["finish_reason"] = {"type": "length", "length": r.max_new_tokens}
            meta["e2e_latency"] = round((r.t_done or 0) - r.t_arrival, 6)
        return meta

    def _fault_message(self) -> str:
        return ("Internal server error: the scheduler failed while decoding this request "
                "(twin fault: error_rate)")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        if not isinstance(body, dict):
            raise HTTPError(400, "Request body must be a JSON object")
        group, stream, batched = self._parse_generate(body)
        if not group.reqs[0].max_new_tokens:
            return web.json_response(self._gen_output(group, 0) if not batched else
                                     [self._gen_output(group, i) for i in range(len(group.reqs))])
        await self._unless_hung()
        self._submit_group(group)
        if not stream:
            await self._finish_group(group)
            outs = [self._gen_output(group, i) for i in range(len(group.reqs))]
            return web.json_response(outs if batched else outs[0])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        incremental = bool(self.res.args.incremental_streaming_output)
        reported = [0] * len(group.reqs)
        done = [False] * len(group.reqs)
        try:
            while not all(done):
                await group.event.wait()
                group.event.clear()
                for i, r in enumerate(group.reqs):
                    if done[i] or (r.generated == reported[i] and not r.finished):
                        continue
                    if r.failed:
                        group.sync(i)
                        err = {"error": {"message": self._fault_message(), "type": "internal_server_error",
                                         "code": 500, "retryable": False}}
                        await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
                        done[i] = True
                        continue
                    delta = group.sync(i)
                    reported[i] = r.generated
                    out = self._gen_output(group, i, delta if incremental else None)
                    if batched:
                        out["index"] = i
                    await resp.write(b"data: " + json.dumps(out).encode() + b"\n\n")
                    if r.finished:
                        done[i] = True
            await resp.write(b"data: [DONE]\n\n")
        except ConnectionResetError:    # the client went away mid-stream (a gate's early stop, a cut)
            return self._client_gone(group, resp)
        finally:                        # a client gone mid-stream (reset, cancelled) too
            group.abort_unfinished()
        self._user_done(len(group.reqs))
        await resp.write_eof()
        return resp

    def _client_gone(self, group: ReqGroup, resp: web.StreamResponse) -> web.StreamResponse:
        """A streaming client that disconnected: its requests are aborted (by the caller's finally)
        and SGLang's http_server logs one error line for it, not aiohttp's traceback."""
        for r in group.reqs:
            if not r.finished:
                self.log.error("[http_server] Error: Request is disconnected from the client side (type 3). "
                               f"Abort request obj.rid='{r.rid}'")
        return resp

    def _gen_output(self, group: ReqGroup, i: int, delta: str | None = None) -> dict:
        group.sync(i)
        text = group.texts[i] if delta is None else delta
        return {"text": text, "output_ids": list(group.ids[i]), "meta_info": self._meta(group, i)}

    # ------------------------------------------------------------------ OpenAI
    def _usage(self, group: ReqGroup) -> dict:
        p = sum(r.input_len for r in group.reqs)
        c = sum(r.generated for r in group.reqs)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
                "prompt_tokens_details": None, "reasoning_tokens": 0}

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        return await self._openai(request, body, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        return await self._openai(request, body, chat=True)

    async def _openai(self, request: web.Request, body: dict, chat: bool) -> web.StreamResponse:
        if not isinstance(body, dict):
            raise HTTPError(400, "Request body must be a JSON object")
        if int(body.get("n") or 1) != 1:
            raise HTTPError(400, "n > 1 is not supported by this server")
        group = ReqGroup()
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise HTTPError(400, "messages must be a non-empty list")
            n_in = sum(count_text_tokens(str(m.get("content") or "")) + 4 for m in msgs if isinstance(m, dict))
            prompts = [(n_in, _seed(msgs))]
            max_new = body.get("max_completion_tokens") or body.get("max_tokens")
            max_new = int(max_new) if max_new is not None else self.res.context_len - n_in
            max_new = min(max_new, max(1, self.res.context_len - n_in))
        else:
            prompt = body.get("prompt")
            if prompt is None:
                raise HTTPError(400, "prompt is required")
            if isinstance(prompt, str):
                prompts = [(count_text_tokens(prompt), _seed(prompt))]
            elif isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
                prompts = [(len(prompt), _seed(prompt))]
            elif isinstance(prompt, list) and prompt:
                prompts = [((len(p) if isinstance(p, list) else count_text_tokens(str(p))), _seed(p)) for p in prompt]
            else:
                raise HTTPError(400, "prompt must be a string, a list of strings or token ids")
            max_new = body.get("max_tokens")
            max_new = 16 if max_new is None else int(max_new)
        for n, seed in prompts:
            self._make_req(group, max(1, n), max(1, max_new), seed)
        model = body.get("model") or self.res.served_model_name
        cid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        await self._unless_hung()
        self._submit_group(group)
        stream = bool(body.get("stream"))
        if not stream:
            await self._finish_group(group)
            choices = []
            for i, r in enumerate(group.reqs):
                group.sync(i)
                if chat:
                    choices.append({"index": i, "message": {"role": "assistant", "content": group.texts[i],
                                                            "reasoning_content": None, "tool_calls": None},
                                    "logprobs": None, "finish_reason": "length", "matched_stop": None})
                else:
                    choices.append({"index": i, "text": group.texts[i], "logprobs": None,
                                    "finish_reason": "length", "matched_stop": None})
            return web.json_response({"id": cid, "object": "chat.completion" if chat else "text_completion",
                                      "created": created, "model": model, "choices": choices,
                                      "usage": self._usage(group)})
        so = body.get("stream_options") or {}
        include_usage = bool(so.get("include_usage")) or bool(
            getattr(self.res.args.ns, "stream_response_default_include_usage", False))
        obj = "chat.completion.chunk" if chat else "text_completion"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        def chunk(i: int, text: str | None, finish: str | None, first: bool = False) -> bytes:
            if chat:
                delta: dict[str, Any] = {}
                if first:
                    delta["role"] = "assistant"
                if text is not None:
                    delta["content"] = text
                choice = {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish,
                          "matched_stop": None}
            else:
                choice = {"index": i, "text": text or "", "logprobs": None, "finish_reason": finish,
                          "matched_stop": None}
            d = {"id": cid, "object": obj, "created": created, "model": model, "choices": [choice],
                 "usage": None}
            return b"data: " + json.dumps(d).encode() + b"\n\n"

        reported = [0] * len(group.reqs)
        done = [False] * len(group.reqs)
        try:
            if chat:
                for i in range(len(group.reqs)):
                    await resp.write(chunk(i, "", None, first=True))
            while not all(done):
                await group.event.wait()
                group.event.clear()
                for i, r in enumerate(group.reqs):
                    if done[i] or (r.generated == reported[i] and not r.finished):
                        continue
                    if r.failed:
                        err = {"error": {"message": self._fault_message(), "type": "internal_server_error",
                                         "code": 500, "retryable": False}}
                        await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
                        done[i] = True
                        continue
                    delta = group.sync(i)
                    reported[i] = r.generated
                    if delta:
                        await resp.write(chunk(i, delta, None))
                    if r.finished:
                        await resp.write(chunk(i, None if chat else "", "length"))
                        done[i] = True
            if include_usage:
                d = {"id": cid, "object": obj, "created": created, "model": model, "choices": [],
                     "usage": self._usage(group)}
                await resp.write(b"data: " + json.dumps(d).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
        except ConnectionResetError:    # the client went away mid-stream
            return self._client_gone(group, resp)
        finally:                        # a client gone mid-stream (reset, cancelled) too
            group.abort_unfinished()
        self._user_done(len(group.reqs))
        await resp.write_eof()
        return resp

    # ------------------------------------------------------------------ warmup
    async def warmup(self) -> None:
        f = self.res.faults
        if self.res.args.skip_server_warmup:
            self.status = "Up"
            self.log.info("The server is fired up and ready to roll!")
            return
        await asyncio.sleep(f.warmup_seconds)
        if f.never_healthy:
            self.log.info("Start of co-locate warmup ...")  # and never finishes
            await asyncio.Event().wait()
        req = Req(rid="WARMUP_" + uuid.uuid4().hex[:8], input_len=6, max_new_tokens=8, internal=True)
        group = ReqGroup()
        group.add(req, 0)
        self.engine.submit(req)
        await self._wait_group(group)
        self.status = "Up"
        self.startup_time = time.time() - self.started_at
        self.log.info("End of prefill warmup with status 200, resp: [{'text': ..., 'meta_info': ...}]")
        self.log.info("The server is fired up and ready to roll!")
