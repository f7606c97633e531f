"""accel.runtime: the embedded serving runtime (paged KV cache, continuous batching, prefix caching).

Modules (bookkeeping is plain Python; only attention / models / model_runner / sampler touch torch):
  config            RuntimeConfig: every runtime setting, declared once
  sequence          Sequence, SequenceStatus, FinishReason, RequestMetrics
  block_pool        BlockPool: free queue, ref counts, chained-hash prefix cache, LRU eviction
  kv_cache_manager  KVCacheManager: get_computed_blocks, allocate_slots (all-or-nothing), free
  scheduler         Scheduler, SchedulerConfig, QueueFullError
  outputs           SchedulerOutput, ScheduledRequest, ModelRunnerOutput
  attention         paged attention over a flat token batch, PagedKVCache (optionally int8)
  models/           one file per family over shared layers (llama: Llama / Mistral / Qwen2 / SmolLM), the native
                    decode step, load_model
  model_runner      ModelRunner: flat tensors from a SchedulerOutput, forward, sampling
  detokenizer       IncrementalDetokenizer: text deltas and stop strings
  engine            Engine, EngineConfig, RequestOutput, EngineStats, stream_generate

`from accel.runtime import Engine` works lazily, so importing the bookkeeping modules never loads torch.
"""

_LAZY = {"Engine": "engine", "EngineConfig": "engine", "RequestOutput": "engine", "EngineStats": "engine",
         "stream_generate": "engine", "QueueFullError": "scheduler", "SamplingParams": "sampling_params"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"accel.runtime.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'accel.runtime' has no attribute {name!r}")
