"""Settings shared by every replica of a simulated deployment."""

from __future__ import annotations

from dataclasses import dataclass, field

from ._latency import LatencyModel

__all__ = ["VLLM_VERSION", "SimConfig"]

# What /version reports: vLLM's surface, marked as simulated so a ledger
# recording engine_version never mistakes the sim for a real engine.
VLLM_VERSION = "0.33.0+sim"


@dataclass(frozen=True)
class SimConfig:
    """Launch settings of the simulated replicas and tier."""

    model_name: str = "sim-27b"
    max_model_len: int = 270_336
    block_size: int = 16
    """Prefix-cache block, tokens (16 as on GPU; vLLM on CPU uses 128)."""
    chunk_size: int = 256
    """Shared-tier chunk, tokens (LMCache's default)."""
    capacity_blocks: int = 65_536
    """Per-replica prefix cache capacity (num_gpu_blocks), LRU beyond it."""
    tier_capacity_chunks: int = 1 << 20
    time_scale: float = 1.0
    """Multiplies every simulated delay (0.001 for tests)."""
    latency: LatencyModel = field(default_factory=LatencyModel)
    enable_prompt_tokens_details: bool = True
    cache_dtype: str = "fp8"
    request_log_size: int = 100_000

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.chunk_size < 1:
            raise ValueError("block_size and chunk_size must be at least 1")
        if self.time_scale < 0:
            raise ValueError("time_scale must be >= 0")

    def cache_info(self) -> dict[str, str]:
        """Labels of vllm:cache_config_info, as vLLM exposes its CacheConfig."""
        return {
            "block_size": str(self.block_size),
            "cache_dtype": self.cache_dtype,
            "enable_prefix_caching": "True",
            "num_gpu_blocks": str(self.capacity_blocks),
            "num_cpu_blocks": "None",
            "prefix_caching_hash_algo": "sha256",
            "gpu_memory_utilization": "0.92",
        }
