#!/usr/bin/python3
"""Reference numbers for a tiny GPT from an independent implementation (PyTorch, float64).

Builds the GPT that actorpipe builds (pre-LN GPT-2 blocks, tanh GELU, layernorm eps 1e-5,
causal attention, tied LM head, mean softmax cross-entropy with ignore index -1), with the
initial weights of actorpipe's documented init (SplitMix64 + Box-Muller, engine/rng.hpp),
runs 3 AdamW steps of 2 microbatches each (lr warm-up, decoupled weight decay on matrices and
embeddings only, global-norm clipping active) and writes a safetensors file with:

  layers.<i>.<slot>         initial weights (actorpipe's layer-granular names), F32
  grads.layers.<i>.<slot>   gradient of the first step's loss (before clipping), F32
  final.layers.<i>.<slot>   weights after the 3 steps, F32
  tokens, targets           (steps, microbatches, B, T) I32; some targets are -1 (ignored)
  logits                    (B, T, V) of step 0, microbatch 0
  mb_loss                   (1,) mean token loss of step 0, microbatch 0
  step_loss, grad_norm      (steps,) loss of each step (mean over microbatches of each
                            microbatch's mean token loss) and its global gradient norm
  __metadata__              format_version, config (JSON), generator

The tied embedding appears under both names (layers.0.wte and layers.<L+1>.lm_head.weight)
with identical values and gradients (the sum of both uses). The computation runs in float64
from float32 initial weights; stored values are rounded to float32.

Regenerate (from the repository root; needs Debian's python3-torch):

    /usr/bin/python3 bench/peers/gpt_reference.py tests/data/gpt_tiny_ref_v1.safetensors
"""

import json
import math
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

FORMAT_VERSION = "1"

CONFIG = dict(
    vocab_size=64, context=16, width=32, depth=2, heads=4, tied=True, init_seed=7,
    B=2, T=16, microbatches=2, steps=3, data_seed=11,
    # eps 1e-6, not 1e-8: the attention key bias has an exactly zero gradient (softmax is
    # shift invariant), so its float32 gradient is rounding noise (~1e-12) that AdamW divides
    # by eps; with 1e-6 the resulting update noise (~1e-8) stays far below the tolerances.
    optimizer=dict(kind="adamw", lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-6, weight_decay=0.1,
                   grad_clip=0.5, warmup_steps=2),
)

MASK64 = (1 << 64) - 1


# --- actorpipe's init RNG (engine/rng.hpp) -----------------------------------------------

class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def uniform(self):
        return ((self.next() >> 11) + 0.5) * 2.0 ** -53


def derive_seed(seed, a, b):
    x = SplitMix64(seed).next() ^ a
    y = SplitMix64(x).next() ^ b
    return SplitMix64(y).next()


def normals(seed, n):
    """n standard normals by Box-Muller: r·cos(2πu2) first, then r·sin(2πu2)."""
    rng = SplitMix64(seed)
    out = []
    while len(out) < n:
        u1 = rng.uniform()
        u2 = rng.uniform()
        r = math.sqrt(-2.0 * math.log(u1))
        theta = 2.0 * math.pi * u2
        out.append(r * math.cos(theta))
        out.append(r * math.sin(theta))
    return np.array(out[:n], dtype=np.float64)


def init_normal(init_seed, layer, slot, shape, std_f32):
    n = int(np.prod(shape))
    z = normals(derive_seed(init_seed, layer, slot), n)
    return (float(std_f32) * z).astype(np.float32).reshape(shape)


def initial_weights(cfg):
    """Returns {checkpoint name: float32 array} in actorpipe's slot order and init scheme."""
    V, maxT, C, L = cfg["vocab_size"], cfg["context"], cfg["width"], cfg["depth"]
    seed = cfg["init_seed"]
    std = np.float32(0.02)
    res_std = np.float32(std / np.sqrt(np.float32(2 * L)))  # float32 arithmetic, as in C++
    w = {}
    w["layers.0.wte"] = init_normal(seed, 0, 0, (V, C), std)
    w["layers.0.wpe"] = init_normal(seed, 0, 1, (maxT, C), std)
    for l in range(1, L + 1):
        p = f"layers.{l}."
        w[p + "ln1.weight"] = np.ones(C, np.float32)
        w[p + "ln1.bias"] = np.zeros(C, np.float32)
        w[p + "attn.qkv.weight"] = init_normal(seed, l, 2, (3 * C, C), std)
        w[p + "attn.qkv.bias"] = np.zeros(3 * C, np.float32)
        w[p + "attn.proj.weight"] = init_normal(seed, l, 4, (C, C), res_std)
        w[p + "attn.proj.bias"] = np.zeros(C, np.float32)
        w[p + "ln2.weight"] = np.ones(C, np.float32)
        w[p + "ln2.bias"] = np.zeros(C, np.float32)
        w[p + "mlp.fc.weight"] = init_normal(seed, l, 8, (4 * C, C), std)
        w[p + "mlp.fc.bias"] = np.zeros(4 * C, np.float32)
        w[p + "mlp.proj.weight"] = init_normal(seed, l, 10, (C, 4 * C), res_std)
        w[p + "mlp.proj.bias"] = np.zeros(C, np.float32)
    h = f"layers.{L + 1}."
    w[h + "ln_f.weight"] = np.ones(C, np.float32)
    w[h + "ln_f.bias"] = np.zeros(C, np.float32)
    assert cfg["tied"]
    w[h + "lm_head.weight"] = w["layers.0.wte"].copy()
    return w


# --- the model in PyTorch ----------------------------------------------------------------

def tied_name(cfg):
    return f"layers.{cfg['depth'] + 1}.lm_head.weight"


def make_params(weights, cfg):
    """Leaf tensors (float64) keyed by name; the tied copy is the same tensor as wte."""
    params = {}
    for name, value in weights.items():
        if name == tied_name(cfg):
            continue
        params[name] = torch.tensor(value, dtype=torch.float64, requires_grad=True)
    return params


def gpt_forward(P, tokens, cfg):
    """Logits (B,T,V) of the GPT with parameters P for tokens (B,T)."""
    L, NH, C = cfg["depth"], cfg["heads"], cfg["width"]
    B, T = tokens.shape
    hs = C // NH
    x = P["layers.0.wte"][tokens] + P["layers.0.wpe"][:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(1, L + 1):
        p = lambda s: P[f"layers.{l}.{s}"]  # noqa: E731
        h = F.layer_norm(x, (C,), p("ln1.weight"), p("ln1.bias"), eps=1e-5)
        qkv = F.linear(h, p("attn.qkv.weight"), p("attn.qkv.bias"))
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        scores = scores.masked_fill(~causal, float("-inf"))
        y = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, p("attn.proj.weight"), p("attn.proj.bias"))
        h = F.layer_norm(x, (C,), p("ln2.weight"), p("ln2.bias"), eps=1e-5)
        h = F.gelu(F.linear(h, p("mlp.fc.weight"), p("mlp.fc.bias")), approximate="tanh")
        x = x + F.linear(h, p("mlp.proj.weight"), p("mlp.proj.bias"))
    hp = f"layers.{L + 1}."
    x = F.layer_norm(x, (C,), P[hp + "ln_f.weight"], P[hp + "ln_f.bias"], eps=1e-5)
    return x @ P["layers.0.wte"].T  # tied LM head


def microbatch_loss(logits, targets):
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1).long(), ignore_index=-1)


def make_batches(cfg):
    rng = np.random.default_rng(cfg["data_seed"])
    S, M, B, T, V = cfg["steps"], cfg["microbatches"], cfg["B"], cfg["T"], cfg["vocab_size"]
    seq = rng.integers(0, V, size=(S, M, B, T + 1), dtype=np.int64)
    tokens = seq[..., :-1].astype(np.int32)
    targets = seq[..., 1:].astype(np.int32)
    targets[0, 0, 0, 3] = -1  # ignored targets in the first and a later microbatch
    targets[0, 0, 1, 7] = -1
    targets[1, 1, 0, 0] = -1
    return tokens, targets


def clip_scale(norm, max_norm):
    """As torch.nn.utils.clip_grad_norm_ (and kernels/optimizer.hpp clip_scale)."""
    return max_norm / (norm + 1e-6) if (max_norm > 0 and norm > max_norm) else 1.0


def run(cfg):
    weights = initial_weights(cfg)
    tokens, targets = make_batches(cfg)
    P = make_params(weights, cfg)
    o = cfg["optimizer"]
    decay = [p for n, p in P.items() if p.dim() >= 2]
    no_decay = [p for n, p in P.items() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [dict(params=decay, weight_decay=o["weight_decay"]), dict(params=no_decay, weight_decay=0.0)],
        lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])

    out = {}
    step_losses, grad_norms = [], []
    for s in range(cfg["steps"]):
        opt.zero_grad(set_to_none=False)
        M = cfg["microbatches"]
        loss = 0.0
        for j in range(M):
            logits = gpt_forward(P, torch.tensor(tokens[s, j], dtype=torch.long), cfg)
            mb = microbatch_loss(logits, torch.tensor(targets[s, j]))
            (mb / M).backward()
            loss += mb.item() / M
            if s == 0 and j == 0:
                out["logits"] = logits.detach().numpy().astype(np.float32)
                out["mb_loss"] = np.array([mb.item()], np.float32)
        norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in P.values()))  # wte once
        if s == 0:
            for name, p in P.items():
                out["grads." + name] = p.grad.numpy().astype(np.float32)
            out["grads." + tied_name(cfg)] = out["grads.layers.0.wte"]
        step = s + 1
        lr = o["lr"] * min(1.0, step / o["warmup_steps"]) if o["warmup_steps"] > 0 else o["lr"]
        for g in opt.param_groups:
            g["lr"] = lr
        scale = clip_scale(norm, o["grad_clip"])
        with torch.no_grad():
            for p in P.values():
                p.grad.mul_(scale)
        opt.step()
        step_losses.append(loss)
        grad_norms.append(norm)
    assert grad_norms[0] > o["grad_clip"], "clipping must be active in the reference"
    for name, p in P.items():
        out["final." + name] = p.detach().numpy().astype(np.float32)
    out["final." + tied_name(cfg)] = out["final.layers.0.wte"]
    out["step_loss"] = np.array(step_losses, np.float32)
    out["grad_norm"] = np.array(grad_norms, np.float32)
    out["tokens"] = tokens
    out["targets"] = targets
    return weights, out


def write_safetensors(path, tensors, metadata):
    """Minimal safetensors writer: 8-byte LE header size, JSON header, raw LE data."""
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        dtype = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}[arr.dtype]
        data = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gpt_reference.py OUTPUT.safetensors")
    torch.manual_seed(0)
    weights, out = run(CONFIG)
    tensors = dict(weights)
    tensors.update(out)
    metadata = {"format_version": FORMAT_VERSION, "config": json.dumps(CONFIG, sort_keys=True),
                "generator": f"bench/peers/gpt_reference.py (torch {torch.__version__}, float64)"}
    write_safetensors(sys.argv[1], tensors, metadata)
    print(f"wrote {sys.argv[1]}: {len(tensors)} tensors, step losses "
          f"{[round(float(x), 6) for x in out['step_loss']]}, grad norms "
          f"{[round(float(x), 6) for x in out['grad_norm']]}")


if __name__ == "__main__":
    main()
