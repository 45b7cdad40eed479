"""What the planner plans for besides the model (models/shape.py): a machine's limits, and the workload put on one by
the other."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator (or this machine): memory, bandwidth, dense peak FLOP/s per math dtype, board power."""

    key: str
    name: str
    memory_bytes: float
    bandwidth: float  # bytes/s
    flops: dict[str, float]  # dtype -> dense FLOP/s (no sparsity)
    tdp_w: float | None
    measured: bool = False
    source: str = ""

    def peak(self, math_dtype: str) -> tuple[float, str]:
        """Peak dense FLOP/s for `math_dtype`, falling back to bf16/fp16 (e.g. fp8 on an A100), then fp32."""
        for dt in (math_dtype, "bf16", "fp16", "fp32"):
            if dt in self.flops:
                return self.flops[dt], dt
        raise ValueError(f"hardware {self.key} lists no FLOP/s")

    def scaled(self, gpus: int) -> HardwareSpec:
        """`gpus` chips in ideal tensor parallel: memory, bandwidth, FLOP/s and power all add up."""
        if gpus == 1:
            return self
        return replace(
            self,
            key=f"{self.key} x{gpus}",
            memory_bytes=self.memory_bytes * gpus,
            bandwidth=self.bandwidth * gpus,
            flops={k: v * gpus for k, v in self.flops.items()},
            tdp_w=None if self.tdp_w is None else self.tdp_w * gpus,
        )


@dataclass(frozen=True)
class Workload:
    """How the model is run: dtypes, batch of concurrent sequences, prompt and output lengths, context held."""

    weights: str | None = None  # None: the model's native dtype, or its file's real bytes
    kv: str = "fp16"
    batch: int = 1
    prompt: int = 1024
    output: int = 256
    context: int | None = None  # None: prompt + output
    gpus: int = 1
    price_per_hour: float | None = None  # USD per chip-hour
    memory_utilization: float = 0.9
    tdp_w: float | None = None  # overrides the hardware's board power
    measured_tps: float | None = None

    @property
    def context_tokens(self) -> int:
        return self.context if self.context is not None else self.prompt + self.output
