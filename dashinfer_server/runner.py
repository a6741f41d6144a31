"""One running model: the scheduler thread that turns requests into steps and steps into tokens.

    schedule -> plan -> forward -> sample -> deliver -> retire finished

User threads only hand requests and stops over (under the lock); the thread owns every
sequence, the block pool and the model from then on.
"""
import logging
import threading
import time

from dashinfer_client.types import GenerateRequestStatus

from .block_pool import BlockPool
from .model import DecoderModel
from .plan import build_plan
from .sampler import Sampler
from .scheduler import Scheduler
from .sequence import Phase, Sequence
from .stopping import check_stop

log = logging.getLogger("dashinfer_server")

KV_MODES = {0: "bf16", 1: "int8", 2: "uint4"}


def max_step_tokens(cfg) -> int:
    """Tokens one step computes at most (a prefill chunk plus the decodes beside it)."""
    return max(cfg.max_prefill_length or 1024, cfg.max_batch + 1)


def build_decoder(model, cfg, group=None) -> DecoderModel:
    """This rank's DecoderModel for the runtime config cfg. Rank 0's runner and every worker
    build theirs here, so workspaces and KV caches agree with the plans rank 0 broadcasts."""
    block_size = cfg.kv_cache_span_size
    return DecoderModel(model, KV_MODES[int(cfg.kv_cache_mode)],
                        ModelRunner._num_blocks(cfg, model.config, block_size), block_size,
                        max_step_tokens(cfg) + cfg.max_batch, cfg.max_batch, group)


class ModelRunner:
    def __init__(self, model, cfg, group=None):
        """model: a DashInferModel; cfg: the AsModelRuntimeConfig."""
        self.cfg = cfg
        mc = model.config
        self.max_step_tokens = max_step_tokens(cfg)
        self.model = build_decoder(model, cfg, group)
        self.pool = BlockPool(self.model.kv.num_blocks, cfg.kv_cache_span_size, cfg.prefill_cache)
        self.scheduler = Scheduler(self.pool, cfg.max_batch, self.max_step_tokens)
        self.sampler = Sampler()
        self.vocab_size = mc.vocab_size
        self._cond = threading.Condition()
        self._incoming, self._stops = [], []
        self._running = False
        self._thread = None

    @staticmethod
    def _num_blocks(cfg, mc, block_size) -> int:
        from .kv_cache import bytes_per_block
        if cfg.kv_cache_memory_mb:
            per_block = bytes_per_block(KV_MODES[int(cfg.kv_cache_mode)], mc.num_hidden_layers,
                                        mc.num_key_value_heads, block_size, mc.head_dim)
            return max(1, cfg.kv_cache_memory_mb * 2**20 // per_block)
        return cfg.max_batch * -(-cfg.max_length // block_size)

    @property
    def block_capacity(self) -> int:
        return self.pool.block_size * len(self.pool.blocks)

    # ---- called by user threads ---------------------------------------------------------

    def submit(self, seq: Sequence) -> None:
        with self._cond:
            self._incoming.append(seq)
            self._cond.notify()

    def stop_request(self, seq: Sequence) -> None:
        with self._cond:
            self._stops.append(seq)
            self._cond.notify()

    def start(self) -> None:
        self._warm_up()
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="dashinfer-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; every unfinished request is interrupted."""
        with self._cond:
            self._running = False
            self._cond.notify()
        if self._thread:
            self._thread.join()
            self._thread = None
        for seq in self._incoming + list(self.scheduler.waiting) + list(self.scheduler.running):
            self._retire(seq, GenerateRequestStatus.GenerateInterrupted, "the model was stopped")
        self._incoming.clear()

    # ---- the scheduler thread -----------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
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
                    self._retire(seq, GenerateRequestStatus.GenerateFinished)
            try:
                self.step()
            except Exception as e:  # a bug must not hang every client: fail what ran, go on
                log.exception("step failed")
                for seq in list(self.scheduler.running):
                    self._retire(seq, GenerateRequestStatus.GenerateInterrupted, f"step failed: {e}")

    def step(self) -> None:
        chunks, interrupted = self.scheduler.schedule()
        for seq in interrupted:
            self._retire(seq, GenerateRequestStatus.GenerateInterrupted,
                         "KV cache exhausted: interrupted to let earlier requests go on")
        if not chunks:
            return
        logits = self._forward(build_plan(chunks, self.pool.block_size))
        self.scheduler.advance(chunks)
        sampled = [c.seq for c in chunks if c.sample]
        result = self.sampler.sample(logits, [seq.sampling for seq in sampled])
        for row, seq in enumerate(sampled):
            token = int(result.ids[row])
            first = seq.num_generated == 0
            seq.tokens.append(token)  # the sampler has appended it to its own history
            if first:
                seq.queue.set_status(GenerateRequestStatus.ContextFinished)
            if result.top_logprobs is not None and seq.sampling.params.logprobs:
                seq.queue.push(token, [result.top_logprobs[row]], [float(result.token_logprobs[row])],
                               prefix_cache_len=seq.table.cached_len)
            else:
                seq.queue.push(token, prefix_cache_len=seq.table.cached_len)
            if check_stop(seq.sampling, token) is not None or len(seq.tokens) >= seq.max_length:
                self._retire(seq, GenerateRequestStatus.GenerateFinished)

    def _forward(self, plan):
        """Hand the plan to the other ranks, then run this rank's shard of it."""
        group = self.model.group
        group.step(self.cfg.model_name, plan)
        try:
            return self.model.forward(plan)
        except BaseException as e:
            group.step_failed(e)
            raise

    def _retire(self, seq: Sequence, status, error=None) -> None:
        if seq.phase != Phase.DONE:
            self.scheduler.finish(seq)
        seq.queue.set_status(status, error)

    def _warm_up(self) -> None:
        """Run one step of the largest size so every buffer is touched before requests come."""
        t0 = time.perf_counter()
        n = min(self.max_step_tokens, self.block_capacity - 1, self.cfg.max_length)
        seq = Sequence([0] * n, n + 1)
        table = self.pool.allocate(seq.tokens)
        seq.table, seq.phase = table, Phase.PREFILL
        from .scheduler import Chunk
        self._forward(build_plan([Chunk(seq, 0, n, True)], self.pool.block_size))
        self.pool.free(table)
        self.pool.clear_cache()
        log.info("warm-up: %d tokens in %.2f s", n, time.perf_counter() - t0)
