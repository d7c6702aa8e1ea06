"""Fitted model parameters, as plain immutable data (the functions live in perf/)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PerfParams:
    """The 7 throughput parameters of the Pollux goodput model (seconds).

    T_grad(m) = alpha_c + beta_c * m
    T_sync(N, K) = 0 if K == 1; alpha_r + beta_r*(K-2) if N == 1; alpha_n + beta_n*(K-2) else
    T_iter = (T_grad^gamma + T_sync^gamma)^(1/gamma) + s * T_grad
    """

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float


@dataclass(frozen=True, slots=True)
class GradParams:
    """Gradient statistics: squared norm of the true gradient and its variance."""

    sqr: float
    var: float


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """Batch-size limits of one application.

    Attributes:
        init_batch_size: M0, the batch size progress is measured against.
        max_batch_size: the largest total batch size allowed.
        min_local_bsz: the smallest per-GPU batch.
        max_local_bsz: the largest per-GPU batch that fits in GPU memory.
    """

    init_batch_size: int
    max_batch_size: int
    min_local_bsz: int
    max_local_bsz: int
