"""EAGLE-style feature-conditioned Mamba-2 drafter: feasibility experiment (session 24)."""
import json, math, sys, time, glob, random
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)

class RMS(nn.Module):
    def __init__(s, d, eps=1e-5):
        super().__init__(); s.w = nn.Parameter(torch.ones(d)); s.eps = eps
    def forward(s, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.eps) * s.w

class Mixer(nn.Module):
    """Mamba-2 mixer (ngroups 1): in_proj -> conv -> SSD -> gated RMSNorm -> out_proj."""
    def __init__(s, d, N=64, P=64, expand=2, K=4):
        super().__init__()
        s.di = expand * d; s.H = s.di // P; s.P = P; s.N = N; s.K = K
        s.conv_dim = s.di + 2 * N
        s.in_proj = nn.Linear(d, s.di + s.conv_dim + s.H, bias=False)
        s.conv = nn.Conv1d(s.conv_dim, s.conv_dim, K, groups=s.conv_dim, padding=K - 1)
        dt = torch.exp(torch.rand(s.H) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
        s.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        s.A_log = nn.Parameter(torch.log(torch.arange(1, s.H + 1).float()))
        s.D = nn.Parameter(torch.ones(s.H))
        s.norm = RMS(s.di)
        s.out_proj = nn.Linear(s.di, d, bias=False)
    def split(s, zxbcdt):
        return zxbcdt.split([s.di, s.conv_dim, s.H], -1)
    def forward(s, u):  # (B, L, d) -> (B, L, d): quadratic SSD form
        B_, L, _ = u.shape
        z, xbc, dt = s.split(s.in_proj(u))
        xbc = F.silu(s.conv(xbc.transpose(1, 2))[..., :L].transpose(1, 2))
        x, Bm, Cm = xbc.split([s.di, s.N, s.N], -1)
        dt = F.softplus(dt + s.dt_bias)  # (B, L, H)
        A = -torch.exp(s.A_log)
        a = (dt * A).transpose(1, 2)  # (B, H, L) log decay
        cs = a.cumsum(-1)
        seg = cs[..., :, None] - cs[..., None, :]  # (B,H,L,L): sum_{j<i<=t}
        mask = torch.ones(L, L, dtype=torch.bool, device=u.device).tril()
        Lm = torch.exp(seg.masked_fill(~mask, -float("inf")))
        CB = Cm @ Bm.transpose(1, 2)  # (B, L, L)
        xh = x.view(B_, L, s.H, s.P)
        W = CB[:, None] * Lm  # (B,H,L,L)
        y = W @ (xh * dt[..., None]).transpose(1, 2)  # (B,H,L,P)
        y = y.transpose(1, 2) + xh * s.D[:, None]
        y = s.norm(y.reshape(B_, L, s.di) * F.silu(z))
        return s.out_proj(y)
    def init_state(s, B_):
        return (torch.zeros(B_, s.conv_dim, s.K - 1), torch.zeros(B_, s.H, s.P, s.N))
    def step(s, u, st):  # u (B, d)
        conv_st, h = st
        z, xbc, dt = s.split(s.in_proj(u))
        win = torch.cat([conv_st, xbc[..., None]], -1)  # (B, C, K)
        xbc = F.silu((win * s.conv.weight[:, 0]).sum(-1) + s.conv.bias)
        x, Bm, Cm = xbc.split([s.di, s.N, s.N], -1)
        dt = F.softplus(dt + s.dt_bias)
        dA = torch.exp(dt * -torch.exp(s.A_log))  # (B,H)
        xh = x.view(-1, s.H, s.P)
        h = h * dA[..., None, None] + (dt[..., None] * xh)[..., None] * Bm[:, None, None, :]
        y = (h @ Cm[:, None, :, None]).squeeze(-1) + xh * s.D[:, None]
        y = s.norm(y.reshape(-1, s.di) * F.silu(z))
        return s.out_proj(y), (win[..., 1:], h)

class FD(nn.Module):
    def __init__(s, D=576, d=576, layers=1, mlp=True):
        super().__init__()
        s.fc = nn.Linear(2 * D, d, bias=False)
        s.nf, s.ne = RMS(D), RMS(D)
        s.norms = nn.ModuleList([RMS(d) for _ in range(layers)])
        s.mix = nn.ModuleList([Mixer(d) for _ in range(layers)])
        s.mlp = nn.Sequential(RMS(d), nn.Linear(d, 4 * d, bias=False), nn.SiLU(), nn.Linear(4 * d, d, bias=False)) if mlp else None
        s.out = nn.Sequential(RMS(d), nn.Linear(d, D, bias=False))
    def inp(s, f, e):
        return s.fc(torch.cat([s.nf(f), s.ne(e)], -1))
    def forward(s, f, e):
        h = s.inp(f, e)
        for n, m in zip(s.norms, s.mix):
            h = h + m(n(h))
        if s.mlp is not None:
            h = h + s.mlp(h)
        return s.out(h)
    def step(s, f, e, states):
        h = s.inp(f, e); new = []
        for n, m, st in zip(s.norms, s.mix, states):
            o, st = m.step(n(h), st); h = h + o; new.append(st)
        if s.mlp is not None:
            h = h + s.mlp(h)
        return s.out(h), new
