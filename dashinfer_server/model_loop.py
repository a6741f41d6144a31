"""The engine's main loop for one model: the thread that turns requests into steps and steps
into tokens, on rank 0 (the other ranks only run the steps it broadcasts: worker.py).

    schedule -> plan -> forward (all ranks) -> sample -> postprocess (deliver, retire finished)

User threads only hand requests and stops over (under the condition's lock); the thread owns
every sequence, the block pool and the model from then on.

Logs (logger "dashinfer_server"): one INFO line per request that ran, when it ends (prompt and
generated tokens, time to first token, decode speed, finish reason); while there is work, an INFO
line of throughput every THROUGHPUT_LOG_S; at DEBUG, the scheduler's admissions, preemptions and interruptions.
"""
import logging
import threading
import time

from dashinfer_client.proto.wire import REQUEST_LOGGER
from dashinfer_client.types import FinishReason, GenerateRequestStatus

from . import op_profile
from .block_pool import BlockPool, BlockTable
from .engine_stat import StatCounters
from .model import apply_thread_num, build_decoder, max_step_tokens
from .plan import build_plan
from .prompt_logprobs import StepScores
from .sampler import Sampler
from .scheduler import Chunk, Scheduler, max_wait_steps, prompt_step_tokens
from .sequence import Phase, Sequence
from .stopping import check_stop

log = logging.getLogger("dashinfer_server")
request_log = logging.getLogger(REQUEST_LOGGER)

THROUGHPUT_LOG_S = 10.0  # seconds between throughput lines while busy


class Throughput:
    """Prompt and generated tokens computed since the last throughput line."""

    def __init__(self):
        self.restart()

    def restart(self) -> None:
        """Start a new window (after a report, or when the loop goes idle: idle time is not
        averaged into the next line)."""
        self.since = time.monotonic()
        self.prompt = self.generated = 0

    def count(self, chunks) -> None:
        """Before the step's postprocess (a decoding sequence's chunk is its newest token)."""
        for c in chunks:
            if c.seq.phase == Phase.DECODE and c.sample:
                self.generated += 1
            else:  # a prompt chunk, or a preempted sequence's token computed again
                self.prompt += c.count
                self.generated += c.sample

    def report(self, running: int, waiting: int) -> None:
        elapsed = time.monotonic() - self.since
        if elapsed >= THROUGHPUT_LOG_S:
            log.info("throughput: prefill %.1f tok/s, decode %.1f tok/s; %d running, %d waiting",
                     self.prompt / elapsed, self.generated / elapsed, running, waiting)
            self.restart()


class ModelLoop:
    def __init__(self, model, cfg, group=None):
        """model: a DashInferModel; cfg: the AsModelRuntimeConfig. The decoder is built by
        load(), in the thread that will run the steps."""
        self.cfg, self._files, self._group = cfg, model, group
        self.max_step_tokens = max_step_tokens(cfg)
        self.model = self.pool = self.scheduler = None
        self.sampler = Sampler()
        self._cond = threading.Condition()
        self._incoming, self._stops = [], []
        self._running = False
        self._thread = None
        self._ready = threading.Event()
        self._start_error = None
        self.throughput = Throughput()
        self.counters = StatCounters()  # what get_as_engine_stat reports
        self.profiler = None  # an OpProfiler when AS_PROFILE=ON (get_op_profiling_info)

    def load(self) -> None:
        """Build the decoder (weights packed, KV cache, workspaces), its block pool and its
        scheduler, in the calling thread, which must be the one that runs the steps: OpenMP
        keeps a thread team per calling thread, and once two teams share the cores libgomp
        stops spinning between kernels (decode1 with 2 threads: 9.8 -> 16.8 ms a step)."""
        if self.model is not None:
            return
        self.model = build_decoder(self._files, self.cfg, self._group)
        if op_profile.enabled():
            self.profiler = self.model.kernels = op_profile.OpProfiler(self.model.kernels)
        self.pool = BlockPool(self.model.kv.num_blocks, self.cfg.kv_cache_span_size, self.cfg.prefill_cache,
                              self.cfg.prefix_cache_ttl)
        self.scheduler = Scheduler(self.pool, self.cfg.max_batch, self.max_step_tokens, max_wait_steps(),
                                   prompt_step_tokens())

    @property
    def block_capacity(self) -> int:
        """Tokens the KV pool holds in all."""
        return self.pool.block_size * len(self.pool.blocks)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ---- called by user threads ---------------------------------------------------------

    def submit(self, seq: Sequence) -> None:
        with self._cond:
            self._incoming.append(seq)
            self._cond.notify()

    def stop_request(self, seq: Sequence) -> None:
        """Ask the thread to finish `seq` before its next step (its queue then turns final)."""
        with self._cond:
            self._stops.append(seq)
            self._cond.notify()

    def start(self) -> None:
        """Start the scheduler thread and wait for its warm-up; raise what the warm-up raised."""
        apply_thread_num(self.cfg)
        self._ready.clear()
        self._start_error = None
        self._running = True
        self._thread = threading.Thread(target=self._loop, name=f"dashinfer-{self.cfg.model_name}",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            self._thread.join()
            self._thread = None
            raise self._start_error

    def stop(self) -> None:
        """Stop the thread; every unfinished request is interrupted (the Engine's stop_model
        waits for them to finish first: this only catches what a failure left behind)."""
        with self._cond:
            self._running = False
            self._cond.notify()
        if self._thread:
            self._thread.join()
            self._thread = None
        with self._cond:
            incoming, self._incoming, self._stops = self._incoming, [], []
        if self.scheduler is None:  # never loaded
            for seq in incoming:
                seq.queue.set_status(GenerateRequestStatus.GenerateInterrupted, "the model was stopped",
                                     FinishReason.INTERRUPTED)
            return
        for seq in incoming:
            self.scheduler.add(seq)
        for seq in list(self.scheduler.waiting) + list(self.scheduler.running):
            self._retire(seq, GenerateRequestStatus.GenerateInterrupted, "the model was stopped")

    # ---- the scheduler thread -----------------------------------------------------------

    def _loop(self) -> None:
        try:
            self.load()
            self.warm_up()  # here too: kernel scratch buffers belong to the thread that runs steps
            if self.profiler is not None:
                self.profiler.reset()  # requests' steps only
        except Exception as e:
            log.exception("loading or warm-up failed")
            self._start_error = e
            self._ready.set()
            return
        self._ready.set()
        while True:
            with self._cond:
                if not self.scheduler.has_work():
                    self.throughput.restart()
                self._cond.wait_for(lambda: not self._running or self._incoming or self._stops
                                    or self.scheduler.has_work())
                if not self._running:
                    return
                incoming, self._incoming = self._incoming, []
                stops, self._stops = self._stops, []
            for seq in incoming:
                self.scheduler.add(seq)
            for seq in stops:
                if seq.phase != Phase.DONE:
                    self._retire(seq, GenerateRequestStatus.GenerateFinished, reason=FinishReason.STOPPED)
            try:
                self.step()
            except Exception as e:  # a bug must not hang every client: fail what ran, go on
                log.exception("step failed")
                for seq in list(self.scheduler.running):
                    self._retire(seq, GenerateRequestStatus.GenerateInterrupted, f"step failed: {e}")

    def step(self) -> None:
        chunks, interrupted = self.scheduler.schedule()
        for seq in interrupted:
            log.warning("request %d interrupted: its %d tokens fill the whole KV cache (%d tokens) "
                        "after %d generated", seq.handle, len(seq.tokens), self.block_capacity,
                        seq.num_generated)
            self._retire(seq, GenerateRequestStatus.GenerateInterrupted,
                         f"KV cache exhausted: the whole cache ({self.block_capacity} tokens) cannot "
                         f"hold this request's next token")
        if not chunks:
            return
        plan = build_plan(chunks, self.pool.block_size)
        logits = self._forward(plan, StepScores(chunks) if len(plan.score_rows) else None)
        sampled = [c.seq for c in chunks if c.sample]
        result = self.sampler.sample(logits, [seq.sampling for seq in sampled])
        self.postprocess(chunks, sampled, result)
        self.throughput.report(len(self.scheduler.running), len(self.scheduler.waiting))

    def postprocess(self, chunks, sampled, result) -> None:
        """Every update a step makes, in one place: the computed tokens (the scheduler's
        bookkeeping), then for each sampled request its new token, its delivery, and whether it
        has finished."""
        self.throughput.count(chunks)
        self.counters.count(chunks, self.pool.prefix_cache)
        self.scheduler.advance(chunks)
        for row, seq in enumerate(sampled):
            token = int(result.ids[row])
            seq.append(token)
            queue = seq.queue
            if seq.num_generated == 1:
                queue.update_stats(time_in_queue=(seq.admitted - seq.arrival) * 1000.0)
            prompt_logprobs = None
            if seq.prompt_scores is not None:  # delivered once, with the first token
                prompt_logprobs, seq.prompt_scores = seq.prompt_scores.pushed(), None
            if result.top_logprobs[row] is not None:
                queue.push(token, [result.top_logprobs[row]], [float(result.token_logprobs[row])],
                           prefix_cache_len=seq.prompt_cached, prompt_logprobs=prompt_logprobs)
            else:
                queue.push(token, prefix_cache_len=seq.prompt_cached, prompt_logprobs=prompt_logprobs)
            reason = check_stop(seq)
            if reason is not None:
                self._retire(seq, GenerateRequestStatus.GenerateFinished, reason=reason)

    def _forward(self, plan, score=None):
        """Hand the plan to the other ranks, then run this rank's shard of it (score: the
        step's StepScores, when it scores prompt rows)."""
        group = self.model.group
        group.step(self.cfg.model_name, plan)
        try:
            return self.model.forward(plan, score)
        except BaseException as e:
            group.step_failed(e)
            raise

    def _retire(self, seq: Sequence, status, error=None, reason=FinishReason.INTERRUPTED) -> None:
        if seq.phase != Phase.DONE:
            self.scheduler.finish(seq)
        if seq.queue.set_status(status, error, reason):
            info = seq.queue.RequestStatInfo()
            request_log.info("request %d%s %s: prompt %d tokens (%d cached), generated %d, TTFT %.1f ms, "
                     "decode %.1f tok/s", seq.handle, f" ({info.uuid})" if info.uuid else "",
                     info.finish_reason, info.context_token_length,
                     info.context_cached_length, info.generated_token_length,
                     info.time_to_first_token, info.generate_tps)

    def warm_up(self) -> None:
        """Run the two extreme steps before any request comes: the largest one (max_step_tokens
        tokens over max_batch sequences, each with a logits row) and a decode at the deepest
        position a request can reach (attention over a whole max_length context). Every
        workspace row and every per-thread kernel scratch reaches its final size here, so a
        request that fits the KV pool never needs new memory later. The KV pool itself is
        allocated whole at construction and its pages are mapped by the OS on first write (see
        kv_cache.py); only the blocks used here are touched."""
        t0 = time.perf_counter()
        self.pool.clear_cache()  # a restarted model starts from an empty prefix cache
        bs, batch, longest = self.pool.block_size, self.cfg.max_batch, self.cfg.max_length - 1
        n = total = min(self.max_step_tokens, batch * longest)
        chunks = []
        while n > 0 and len(chunks) < batch:
            count = min(-(-n // (batch - len(chunks))), longest)
            chunk = self._dummy_chunk(count, count)
            if chunk is None:  # a KV budget smaller than the largest step: warm what fits
                break
            chunks.append(chunk)
            n -= count
        try:
            if chunks:
                self._forward(build_plan(chunks, bs))
        finally:
            for c in chunks:
                self.pool.free(c.seq.table)
        deepest = min(self.cfg.max_length, self.block_capacity)
        chunk = self._dummy_chunk(deepest, 1)
        try:
            self._forward(build_plan([chunk], bs))
        finally:
            self.pool.free(chunk.seq.table)
        log.info("warm-up of %s: %d + 1 tokens (context %d) in %.2f s", self.cfg.model_name,
                 total - n, deepest, time.perf_counter() - t0)

    def _dummy_chunk(self, length: int, count: int):
        """A chunk computing the last `count` of `length` dummy tokens, or None if the pool
        cannot hold them (blocks are taken directly; nothing is registered as a prefix)."""
        table = BlockTable()
        if not self.pool.grow(table, length):
            return None
        seq = Sequence([0] * length, length + 1, table=table, phase=Phase.PREFILL)
        return Chunk(seq, length - count, count, True)
