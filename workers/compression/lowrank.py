"""Low-rank factorisations: exact SVD, randomized SVD and warm-started power iteration.

Every function takes a batch of matrices X of shape (..., m, n) and returns factors
P (..., m, k) and Q (..., n, k) with X ~= P @ Q^T, balanced so that column j of P and
column j of Q have the same norm (what per-column INT8 and FP16 ranges want).
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch


def rank_for(ratio: float, m: int, n: int) -> int:
    """k = ceil(ratio * min(m, n)), computed exactly from the decimal ratio."""
    return math.ceil(Fraction(repr(float(ratio))) * min(m, n))


def low_rank_pays(k: int, m: int, n: int) -> bool:
    """Whether k (m + n) factor values are fewer than the m n dense ones: k < mn / (m + n)."""
    return k > 0 and k * (m + n) < m * n


def orthonormalize(y: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis of the column space of each (..., m, q) matrix (q <= m)."""
    # Cholesky QR with the Gram matrix in float64: one (m, q) product instead of a
    # Householder QR, several times faster; Householder only when y is rank deficient.
    yd = y.double()
    gram = yd.mT @ yd
    r, info = torch.linalg.cholesky_ex(gram, upper=True)
    if bool((info == 0).all()) and bool(torch.isfinite(r).all()):
        eye = torch.eye(r.shape[-1], dtype=r.dtype, device=r.device)
        r_inv = torch.linalg.solve_triangular(r, eye, upper=True)
        return y @ r_inv.to(y.dtype)
    return torch.linalg.qr(y).Q


def balance(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rescale paired columns so that P[:, j] and Q[:, j] have equal norms; P Q^T is unchanged."""
    norm_p = torch.linalg.vector_norm(p, dim=-2, keepdim=True)
    norm_q = torch.linalg.vector_norm(q, dim=-2, keepdim=True)
    ok = (norm_p > 0) & (norm_q > 0)
    factor = torch.where(ok, torch.sqrt(norm_q / torch.where(ok, norm_p, 1.0)), 1.0)
    return p * factor, q / factor


def truncate(p: torch.Tensor, q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Best rank-k approximation of P Q^T when P has orthonormal columns (q x q eigenproblem)."""
    if p.shape[-1] <= k:
        return p, q
    _, vecs = torch.linalg.eigh(q.mT @ q)
    top = vecs[..., -k:]
    return p @ top, q @ top


def svd_factors(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal rank-k factors from the exact SVD (torch.linalg.svd): the paper's method."""
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    root = torch.sqrt(s[..., :k]).unsqueeze(-2)
    return u[..., :k] * root, vh[..., :k, :].mT * root


def subspace_iteration(
    x: torch.Tensor, start: torch.Tensor, passes: int, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-k factors after `passes` products with X or X^T, starting from X @ start.

    Each pass orthonormalises the last product and multiplies by X^T or X in turn; the
    last product is the projection of X on the basis, so it costs no extra pass.
    """
    if passes < 2:
        raise ValueError("subspace iteration needs at least two passes")
    y = x @ start
    y_is_left = True  # y holds columns of the column space (..., m, q)
    basis = start
    for _ in range(passes - 1):
        basis = orthonormalize(y)
        y = (x.mT if y_is_left else x) @ basis
        y_is_left = not y_is_left
    if y_is_left:
        q, p = truncate(basis, y, k)
    else:
        p, q = truncate(basis, y, k)
    return balance(p, q)


def rsvd_factors(
    x: torch.Tensor, k: int, iters: int, oversample: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Randomized SVD (Halko et al. 2009, the algorithm of torch.svd_lowrank) at rank k."""
    n = x.shape[-1]
    width = min(k + oversample, min(x.shape[-2:]))
    sketch = torch.randn(
        (*x.shape[:-2], n, width), generator=generator, dtype=x.dtype, device=x.device
    )
    return subspace_iteration(x, sketch, passes=2 * iters + 2, k=k)


def power_factors(
    x: torch.Tensor, k: int, iters: int, warm: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PowerSGD-style power iteration from the right factor of the previous step.

    `warm` is (..., n, q) with q >= k (q > k oversamples and truncates to k). Returns
    P, Q and the next warm start (the unbalanced right factor, at the data's scale).
    """
    if iters < 1:
        raise ValueError("power iteration needs at least one iteration per step")
    q = warm
    p = orthonormalize(x @ q)
    q = x.mT @ p
    for _ in range(iters - 1):
        p = orthonormalize(x @ q)
        q = x.mT @ p
    pk, qk = truncate(p, q, k)
    pb, qb = balance(pk, qk)
    return pb, qb, q
