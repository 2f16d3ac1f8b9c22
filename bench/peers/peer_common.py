"""What the PyTorch peers of actorpipe-bench share: actorpipe's GPT in PyTorch and how it trains.

torch_step.py (one step of one microbatch) and torch_pipe.py (m microbatches, unsplit and through
Pipe) import it from their own directory: the command-line arguments of the model, the run and
AdamW, torch's thread setup, the model (engine/model/model.hpp: pre-LN GPT-2 blocks with biases, tanh
GELU, layernorm eps 1e-5, causal multi-head attention, tied LM head, mean softmax cross-entropy
with ignore index -1), its AdamW, random tokens, timed steps and the thread environment.
"""

import json
import math
import os
import statistics
import sys
import time

# The environment variables actorpipe-bench sets for a peer (echoed in its JSON line).
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_WAIT_POLICY",
              "OPENBLAS_THREAD_TIMEOUT")


def add_shape_arguments(p, batch_help):
    """The GPT shape and the tokens per microbatch: --vocab .. --seq."""
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--context", type=int, required=True, help="position table size (maxT)")
    p.add_argument("--width", type=int, required=True)
    p.add_argument("--depth", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--batch", type=int, required=True, help=batch_help)
    p.add_argument("--seq", type=int, required=True, help="T tokens per sequence")


def add_run_arguments(p, reps):
    """Threads, timed and untimed steps, AdamW's hyper-parameters and the seed."""
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=reps)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1234)


def check_shape(p, a):
    """Refuses (p.error) a width the heads do not divide or a sequence longer than the context."""
    if a.width % a.heads != 0:
        p.error(f"--width {a.width} is not divisible by --heads {a.heads}")
    if a.seq > a.context:
        p.error(f"--seq {a.seq} is larger than --context {a.context}")


def report_missing(what, error):
    """Prints the JSON line of a peer that cannot import `what`; returns its exit status, 3."""
    print(json.dumps({"ok": False, "missing": True,
                      "error": f"cannot import {what} with {sys.executable}: {error}"}))
    return 3


def setup_torch(torch, a):
    """torch's intra-op threads = --threads, its generator seeded with --seed."""
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)


def torch_config(torch, attention):
    """The head of a peer's JSON line: success, torch's version and threads, the attention."""
    return {
        "ok": True,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "attention": attention,
    }


def thread_env():
    """The thread settings this process runs with, as the peers report them."""
    return {k: os.environ.get(k) for k in THREAD_ENV}


def build_model(torch, a):
    """actorpipe's GPT of shape `a` and how its attention is computed."""
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


def adamw(torch, model, a):
    """AdamW with decoupled weight decay on matrices and embeddings only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps)


def random_tokens(torch, a, rows):
    """`rows` sequences of --seq random tokens and their targets (each the next token)."""
    g = torch.Generator().manual_seed(a.seed)
    seq = torch.randint(0, a.vocab, (rows, a.seq + 1), generator=g)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def timed_steps(step, a):
    """The first step's loss, the --reps timed steps (ms) after --warmup untimed, their median."""
    first_loss = step()
    for _ in range(a.warmup - 1):
        step()
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1000.0)
    return first_loss, times, statistics.median(times)
