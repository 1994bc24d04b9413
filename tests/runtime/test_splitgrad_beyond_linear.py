"""Split backward beyond nn.Linear: a Conv1D (x W + b, W stored in x out) is deferred to W and gives the
same gradients as one ordinary backward; deferred_share measures what stays in B (one process)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from pipeloom.autograd.splitgrad import SplitGrad, deferrable_linears, deferred_share, is_conv1d, weight_grads  # noqa: E402


class Conv1D(nn.Module):
    """transformers' Conv1D, written out (the runtime recognises it by name and shape, not by import)."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.1)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(*x.shape[:-1], self.nf)


class Experts(nn.Module):
    """Fused experts: one 3-D parameter, used through slices (not deferrable)."""

    def __init__(self, n: int, d: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(n, d, d) * 0.1)

    def forward(self, x):
        return sum(nn.functional.linear(x, self.w[e]) for e in range(self.w.shape[0]))


class Block(nn.Module):
    def __init__(self, d: int = 8, experts: int = 0) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = Conv1D(2 * d, d)
        self.down = nn.Linear(2 * d, d)
        self.experts = Experts(experts, d) if experts else None

    def forward(self, x):
        y = x + self.down(torch.tanh(self.up(self.norm(x))))
        return y + self.experts(y) if self.experts is not None else y


def test_conv1d_is_deferred_and_its_gradients_match():
    torch.manual_seed(0)
    m = Block()
    assert is_conv1d(m.up) and not is_conv1d(m.down)
    assert set(map(id, deferrable_linears(m))) == {id(m.up), id(m.down)}
    x = torch.randn(3, 5, 8, requires_grad=True)
    dy = torch.randn(3, 5, 8)
    ps = list(m.parameters())
    want = torch.autograd.grad(m(x), [x] + ps, grad_outputs=dy)
    with SplitGrad(m) as sg:
        stash = []
        with sg.deferring(stash):
            y = m(x)
        kept = sg.kept(ps)
        assert {id(p) for p in ps} - {id(p) for p in kept} == {id(p) for p in (m.up.weight, m.up.bias, m.down.weight,
                                                                               m.down.bias)}
        got_b = torch.autograd.grad(y, [x] + kept, grad_outputs=dy)
        acc = {p: torch.zeros_like(p) for p in ps}
        for p, g in zip(kept, got_b[1:]):
            acc[p] += g
        weight_grads(stash, acc.get)
    assert torch.allclose(got_b[0], want[0], atol=1e-6)
    for p, g in zip(ps, want[1:]):
        assert torch.allclose(acc[p], g, atol=1e-6), p.shape


def test_deferred_share_counts_what_stays_in_b():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8)
    plain = deferred_share(Block(), x)
    assert plain["wgrad_flops"] > 0 and plain["share"] == pytest.approx(1.0)
    fused = deferred_share(Block(experts=4), x)
    # the experts' weight products (4 x 2*N*8*8) stay in B; up and down (2 x 2*N*8*16) are deferred
    n = 2 * 4
    assert fused["deferred_flops"] == 2 * (2 * n * 8 * 16)
    assert fused["wgrad_flops"] == fused["deferred_flops"] + 4 * 2 * n * 8 * 8
