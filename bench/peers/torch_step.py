#!/usr/bin/python3
"""PyTorch peer of actorpipe-bench: the same GPT and the same training step, timed the same way.

Builds actorpipe's GPT (engine/model.hpp: pre-LN GPT-2 blocks with biases, tanh GELU, layernorm
eps 1e-5, causal multi-head attention, tied LM head, mean softmax cross-entropy with ignore
index -1) in PyTorch, float32 on the CPU, and trains it with AdamW (the same hyper-parameters,
decoupled weight decay on matrices and embeddings only, global-norm clipping) on one microbatch
of random tokens. A step is what ReferenceTrainer::step does: zero the gradients, forward,
backward, clip, optimizer update. Prints one JSON line with the median of --reps timed steps
after --warmup untimed ones, the peak RSS of this process and how torch was configured.

actorpipe-bench runs it as a child process, one per configuration, with OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS set to --threads. By hand (tiny shape, one thread):

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/peers/torch_step.py \\
        --vocab 256 --context 128 --width 128 --depth 4 --heads 4 --batch 8 --seq 128 --threads 1

Exit status 3 (with a JSON line saying so) when torch cannot be imported.
"""

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--context", type=int, required=True, help="position table size (maxT)")
    p.add_argument("--width", type=int, required=True)
    p.add_argument("--depth", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--batch", type=int, required=True, help="B sequences per step")
    p.add_argument("--seq", type=int, required=True, help="T tokens per sequence")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args(argv)
    if a.width % a.heads != 0:
        p.error(f"--width {a.width} is not divisible by --heads {a.heads}")
    if a.seq > a.context:
        p.error(f"--seq {a.seq} is larger than --context {a.context}")
    if a.reps < 1 or a.warmup < 1:
        p.error("--reps and --warmup must be at least 1")
    return a


def rss_mb(field):
    """VmRSS / VmHWM of this process in MiB (0 if /proc is unavailable)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def build_model(torch, a):
    nn = torch.nn
    F = torch.nn.functional
    sdpa = getattr(F, "scaled_dot_product_attention", None)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            C = a.width
            self.ln1 = nn.LayerNorm(C, eps=1e-5)
            self.qkv = nn.Linear(C, 3 * C)
            self.proj = nn.Linear(C, C)
            self.ln2 = nn.LayerNorm(C, eps=1e-5)
            self.fc = nn.Linear(C, 4 * C)
            self.fc_proj = nn.Linear(4 * C, C)
            mask = torch.ones(a.seq, a.seq, dtype=torch.bool).tril()
            self.register_buffer("mask", mask, persistent=False)

        def attention(self, x):
            B, T, C = x.shape
            nh = a.heads
            q, k, v = self.qkv(x).split(C, dim=2)
            q = q.view(B, T, nh, C // nh).transpose(1, 2)  # (B, nh, T, hs)
            k = k.view(B, T, nh, C // nh).transpose(1, 2)
            v = v.view(B, T, nh, C // nh).transpose(1, 2)
            if sdpa is not None:
                y = sdpa(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
                y = torch.softmax(att, dim=-1) @ v
            return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))

        def forward(self, x):
            x = x + self.attention(self.ln1(x))
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(a.vocab, a.width)
            self.wpe = nn.Embedding(a.context, a.width)
            self.blocks = nn.ModuleList(Block() for _ in range(a.depth))
            self.ln_f = nn.LayerNorm(a.width, eps=1e-5)
            self.lm_head = nn.Linear(a.width, a.vocab, bias=False)
            self.lm_head.weight = self.wte.weight  # tied
            res_std = 0.02 / math.sqrt(2 * a.depth)
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif "ln" in name.split(".")[-2]:
                    nn.init.ones_(p)
                elif name.endswith("proj.weight"):
                    nn.init.normal_(p, std=res_std)
                else:
                    nn.init.normal_(p, std=0.02)

        def forward(self, idx, targets):
            T = idx.size(1)
            pos = torch.arange(T, dtype=torch.long)
            x = self.wte(idx) + self.wpe(pos)
            for b in self.blocks:
                x = b(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)

    return GPT(), ("sdpa" if sdpa is not None else "explicit softmax(QK^T)V")


def main(argv):
    a = parse_args(argv)
    try:
        import torch
    except ImportError as e:
        print(json.dumps({"ok": False, "missing": True,
                          "error": f"cannot import torch with {sys.executable}: {e}"}))
        return 3
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    import_rss = rss_mb("VmRSS")

    model, attention = build_model(torch, a)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps)
    params = list(model.parameters())

    g = torch.Generator().manual_seed(a.seed)
    seq = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
    idx, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(idx, targets)
        loss.backward()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
        opt.step()
        return loss.item()

    first_loss = step()
    for _ in range(a.warmup - 1):
        step()
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1000.0)
    step_ms = statistics.median(times)
    peak = max(rss_mb("VmHWM"), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
    print(json.dumps({
        "ok": True,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "attention": attention,
        "optimizer": "torch.optim.AdamW (default implementation)",
        "parameters": sum(p.numel() for p in params),
        "first_loss": first_loss,
        "step_ms_all": times,
        "step_ms": step_ms,
        "tokens_per_s": a.batch * a.seq / (step_ms / 1000.0),
        "peak_rss_mb": peak,
        "import_rss_mb": import_rss,
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                "OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT")},
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
