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


ORTHO_TOL = 1e-6
"""Largest max|Q^T Q - I| (measured in float64) that `orthonormalize` accepts from Cholesky
QR; the float32 result is then orthonormal to about 1e-6, well inside the promised 1e-5."""
ORTHONORMAL = 1e-5
"""What `orthonormalize` promises: max|Q^T Q - I| <= 1e-5 for any finite input."""
_SAFE_MAX = 2.0**40
_SAFE_MIN = 2.0**-40
"""Where the float32 products overflow, X is scaled by a power of two that brings its
largest entry into [2^-40, 2^40] and the factorisation runs again."""


def orthogonality_error(q: torch.Tensor) -> torch.Tensor:
    """max|Q^T Q - I| of each (..., m, q) matrix, computed in float64 (NaN stays NaN)."""
    qd = q.double()
    gram = qd.mT @ qd
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    return (gram - eye).abs().amax(dim=(-2, -1))


def _inverse_factor(gram: torch.Tensor) -> torch.Tensor | None:
    """R^{-1} with R^T R = gram (upper R), or None where the factorisation breaks down."""
    r, info = torch.linalg.cholesky_ex(gram, upper=True)
    if not bool((info == 0).all()) or not bool(torch.isfinite(r).all()):
        return None
    eye = torch.eye(r.shape[-1], dtype=r.dtype, device=r.device)
    return torch.linalg.solve_triangular(r, eye, upper=True)


def _certified(gram: torch.Tensor, r_inv: torch.Tensor, m: int) -> bool:
    """Whether Y R^{-1}, formed in float64, is orthonormal to ORTHO_TOL, from q x q figures.

    (Y R^{-1})^T (Y R^{-1}) = R^{-T} G R^{-1} + R^{-T} dG R^{-1} + (rounding of the product),
    where G is the computed Gram matrix and |dG| <= m u |Y|^T |Y| its rounding error. The
    first term is measured here; the other two are bounded by m u ||Y||_F^2 ||R^{-1}||_F^2
    and 2 q u ||Y||_F ||R^{-1}||_F (u = 2^-53), read off trace(G) and R^{-1}. Where the
    measurement plus the bounds pass, the m x q Gram of the basis need not be formed.
    """
    q = gram.shape[-1]
    residual = r_inv.mT @ gram @ r_inv
    residual.diagonal(dim1=-2, dim2=-1).sub_(1.0)
    y_norm2 = gram.diagonal(dim1=-2, dim2=-1).sum(-1)
    inv_norm2 = torch.linalg.vector_norm(r_inv, dim=(-2, -1)).square()
    u = torch.finfo(torch.float64).eps / 2
    kappa2 = y_norm2 * inv_norm2
    bound = (m + 1) * u * kappa2 + 2 * q * u * kappa2.sqrt()
    return _within(torch.linalg.vector_norm(residual, ord=math.inf, dim=(-2, -1)) + bound)


def _within(error: torch.Tensor) -> bool:
    return bool((error <= ORTHO_TOL).all())  # NaN compares false: refused


def orthonormalize(y: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis (max|Q^T Q - I| <= 1e-5) spanning the columns of each
    (..., m, q) matrix (q <= m), of y's dtype, for any finite input.

    Cholesky QR in float64 first (one Gram matrix instead of a Householder QR, several
    times faster), repeated once (Cholesky QR2) where one pass is not orthonormal enough;
    the result is kept only if its measured orthogonality passes ORTHO_TOL (for the first
    pass, measured in q x q space with certified rounding bounds, see `_certified`, and
    where those do not suffice, measured on the basis itself). Otherwise
    (a rank-deficient, zero or badly conditioned y, where Cholesky "succeeds" on a Gram
    matrix that is singular in floating point) Householder QR, whose Q is orthonormal
    whatever y is and whose span contains y's columns: in y's dtype, and again in
    float64 if that one measures past ORTHONORMAL. Cholesky's success flag never
    accepts a basis: it is satisfied by Gram matrices that are singular in floating
    point, whose "factor" gave max|P^T P - I| of about 5 on a rank-16 input.
    """
    yd = y.double()
    gram = yd.mT @ yd
    r_inv = _inverse_factor(gram)
    if r_inv is not None:
        q1 = yd @ r_inv
        if _certified(gram, r_inv, y.shape[-2]):
            return q1.to(y.dtype)
        gram1 = q1.mT @ q1  # measured: the input of the second pass, too
        eye = torch.eye(gram1.shape[-1], dtype=gram1.dtype, device=gram1.device)
        if _within((gram1 - eye).abs().amax(dim=(-2, -1))):
            return q1.to(y.dtype)
        r_inv2 = _inverse_factor(gram1)
        if r_inv2 is not None:
            q2 = q1 @ r_inv2
            if _within(orthogonality_error(q2)):
                return q2.to(y.dtype)
    q = torch.linalg.qr(y).Q  # in y's dtype: float32 Householder is about 10x faster
    if y.dtype != torch.float64 and not bool((orthogonality_error(q) <= ORTHONORMAL).all()):
        q = torch.linalg.qr(yd).Q.to(y.dtype)
    return q


def scale_of(x: torch.Tensor) -> float:
    """A power of two s with max|x / s| in [2^-40, 2^40] (1.0 when already so, or x == 0)."""
    top = float(torch.linalg.vector_norm(x, ord=math.inf)) if x.numel() else 0.0
    if top == 0.0 or _SAFE_MIN <= top <= _SAFE_MAX:
        return 1.0
    return 2.0 ** math.frexp(top)[1]


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
    top = _eigenvectors(q)[..., -k:]
    return p @ top, q @ top


def _eigenvectors(q: torch.Tensor) -> torch.Tensor:
    """Eigenvectors of Q^T Q, ascending eigenvalues, solved in float64, in q's dtype."""
    qd = q.double()
    _, vecs = torch.linalg.eigh(qd.mT @ qd)
    return vecs.to(q.dtype)


def top_eigenvectors(covariance: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest eigenvalues of a symmetric (n, n) matrix and their (n, k) orthonormal
    eigenvectors, ascending, in its dtype (torch.linalg.eigh; a zero matrix gives k
    vectors of an orthonormal basis, so its projections decode to zeros)."""
    values, vecs = torch.linalg.eigh(covariance)
    return values[..., -k:], vecs[..., -k:]


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
    p, q = _subspace_iteration(x, start, passes, k)
    if _finite(p, q):
        return p, q
    scale = scale_of(x)  # float32 products overflowed: redo on X / s (s a power of two)
    if scale == 1.0:
        return p, q
    return _rescaled(*_subspace_iteration(x / scale, start, passes, k), scale)


def _finite(*tensors: torch.Tensor) -> bool:
    # a sum is finite only if every term is (or overflows: then the full check decides)
    return all(bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all()) for t in tensors)


def _subspace_iteration(
    x: torch.Tensor, start: torch.Tensor, passes: int, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
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


def _rescaled(p: torch.Tensor, q: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Factors of s X from balanced factors of X: each takes sqrt(s) (exact for s = 4^j)."""
    if scale == 1.0:
        return p, q
    root = math.sqrt(scale)
    return p * root, q * root


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
    P, Q and the next warm start: the right factor rotated to orthogonal columns in
    ascending order of strength and normalised, with the columns the data left empty (a
    rank-deficient or zero X) marked as zero for the caller to refill.
    """
    if iters < 1:
        raise ValueError("power iteration needs at least one iteration per step")
    p, q, next_warm = _power(x, k, iters, warm)
    if _finite(p, q, next_warm):
        return p, q, next_warm
    scale = scale_of(x)  # float32 products overflowed: redo on X / s (s a power of two)
    if scale == 1.0:
        return p, q, next_warm
    p, q, next_warm = _power(x / scale, k, iters, warm)
    p, q = _rescaled(p, q, scale)
    return p, q, next_warm


def _power(
    x: torch.Tensor, k: int, iters: int, warm: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = warm
    for _ in range(iters - 1):
        p = orthonormalize(x @ q)
        q = (p.mT @ x).mT
    y = x @ q
    fast = _certified_step(x, y, k)
    if fast is not None:
        return fast
    p = orthonormalize(y)
    q = (p.mT @ x).mT
    vecs = _eigenvectors(q)
    q_all = q @ vecs  # orthogonal columns, ascending norms: the empty ones come first
    if q.shape[-1] > k:
        pb, qb = balance(p @ vecs[..., -k:], q_all[..., -k:])
    else:
        pb, qb = balance(p, q)  # the same product P Q^T, no rotation needed
    norms = torch.linalg.vector_norm(q_all, dim=-2, keepdim=True)
    return pb, qb, _next_warm(q_all, norms)


def _next_warm(q_all: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    """The (..., n, q) warm start from orthogonal columns and their norms (..., 1, q): each
    normalised, those the data left empty (below EMPTY_COLUMN of the largest) zero."""
    top = norms.amax(dim=-1, keepdim=True)
    live = norms > EMPTY_COLUMN * top
    return torch.where(live, q_all / torch.where(live, norms, 1.0), 0.0)


def _certified_step(
    x: torch.Tensor, y: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The last power step when one pass of Cholesky QR is certified on Y = X @ warm
    (full column rank, well conditioned), None otherwise (the general path decides).

    The same factors as the general path, formed in the layout the wire sends: P^T
    (..., q, m) = R^{-T} Y^T in float64, then float32, and Q^T = P^T X, so that no
    factor is transposed into a copy on the way out and balancing scales them in place.
    The rows rotate to the eigenvectors of Q^T Q (float64, a q x q problem), so that the
    next warm start ascends in strength as the general path's does (`fit_warm` keeps its
    strongest columns); with q > k (oversampling) the top k are kept, as `truncate` does.
    """
    yd = y.double()
    gram = yd.mT @ yd
    r_inv = _inverse_factor(gram)
    if r_inv is None or not _certified(gram, r_inv, y.shape[-2]):
        return None
    pt = (r_inv.mT @ yd.mT).to(y.dtype)  # (..., q, m), orthonormal rows
    qt = pt @ x  # (..., q, n): Q^T = P^T X
    qtd = qt.double()
    rot = torch.linalg.eigh(qtd @ qtd.mT)[1].mT.to(y.dtype)  # rows: ascending norms
    qt = rot @ qt
    pt = rot[..., -k:, :] @ pt
    norms = torch.linalg.vector_norm(qt, dim=-1, keepdim=True)  # (..., q, 1)
    next_warm = _next_warm(qt.mT, norms.mT)
    # balancing takes sqrt(|q_j|) from each Q column to P (P's columns have unit norm);
    # Y had full column rank and P lies in X's column space, so every kept |q_j| > 0
    root = norms[..., -k:, :].sqrt()
    return pt.mul_(root).mT, (qt[..., -k:, :] / root).mT, next_warm


EMPTY_COLUMN = 1e-6
"""A warm column whose norm is below this fraction of the largest carries no direction of
the data (X had lower rank than the width); `refill_warm` replaces it with a random one."""


def fit_warm(warm: torch.Tensor, width: int) -> torch.Tensor:
    """The (..., n, width) start from a warm start of another width: its `width` strongest
    columns (they ascend in strength, see `power_factors`), or all of them after zero
    columns, which `refill_warm` fills at random.

    k = ceil(r min(m, n)) follows the rows of each matrix, so a stream whose matrices have
    a varying number of rows (ABNet's chunks, packed without their padding) changes the
    width from one matrix to the next; its subspace does not change with it.
    """
    have = warm.shape[-1]
    if have >= width:
        return warm[..., have - width :]
    return torch.cat((warm.new_zeros((*warm.shape[:-1], width - have)), warm), dim=-1)


def refill_warm(warm: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """`warm` with its all-zero columns replaced by random unit columns, so that the next
    step searches every direction again (a stream that was of low rank, or zero, and is not
    any more is caught in one step instead of never)."""
    empty = torch.linalg.vector_norm(warm, dim=-2, keepdim=True) == 0
    if not bool(empty.any()):
        return warm
    fresh = torch.randn(warm.shape, generator=generator, dtype=warm.dtype)
    fresh = fresh / torch.linalg.vector_norm(fresh, dim=-2, keepdim=True).clamp_min(1e-30)
    return torch.where(empty, fresh.to(warm.device), warm)
