"""A stand-in for vLLM 0.33's Gemma 4 text decoder (vllm/model_executor/models/gemma4.py, line numbers below) at a
reduced size, in NumPy: what seeded random weights do to a comparison of KV cache dtypes, without a GPU.

    python3 tests/gpu/gemma4_numerics_cpu.py [SEED...]      (seeds 0 and 1 by default; about 2.5 min a seed, 2 cores)

Variants: the weights as tests/gpu/kv_quant_host.py's randomize() wrote them for the first GPU hold (every float
tensor random, layer_scalar ~ N(0, 0.02)), then layer_scalar = 1 (vLLM's default), q_norm tempered by 1/sqrt(head_dim)
(so scores have a standard deviation near 1, as trained q/k norms give), and the tied embedding at 4/sqrt(hidden) (so
the logits are not flat): the rules randomize() follows now. For each: top-1 agreement of fp16 against fp32, of fp16
against fp16 with 1-ulp noise on every matmul (another kernel's summation order), and of int8 and int4 per-token-head
K/V (symmetric, scale absmax/127 and absmax/7) against the unquantized cache; the attention's peakedness; the logits'
top-1 margin. Printed as a table (docs/verified/numerics-cpu/output.txt).

Structure kept from gemma4.py: embed * sqrt(H) (L864, normalizer in model dtype L1089-1096); PLE inputs (L866-922);
per layer (L714-776): input_layernorm -> q/k/v proj -> q_norm,k_norm (weight, not 1+weight: RMSNorm, L432/446),
v_norm (no weight, L434) -> RoPE -> attention with scaling 1.0 (L400) -> o_proj -> post_attention_layernorm -> +res;
pre_feedforward_layernorm -> gelu_tanh(gate)*up -> down -> post_feedforward_layernorm -> +res;
PLE: gelu(gate(h))*pli -> proj -> post_per_layer_input_norm -> +h; h *= layer_scalar (L774).
KV sharing: the last 20 of 35 layers reuse the K/V of the last owning layer of the same type (L403-486).
Final norm (L1087), tied lm_head, final_logit_softcapping 30 (L1456-1459).
Reduced sizes: H=256, 4 q heads / 1 kv head, head_dim 64 (sliding) / 128 (full, partial rotary 0.25),
intermediate 1024 (2048 double-wide in shared layers), PLE dim 32, vocab 8192, 8 sequences x 128 tokens.
"""
import sys

import numpy as np

H, NH, NKV, HD_S, HD_F, L, NSHARED, INTER, P, V = 256, 4, 1, 64, 128, 35, 20, 1024, 32, 8192
FULL = {4, 9, 14, 19, 24, 29, 34}
B, T = 8, 128
EPS = 1e-6
SOFTCAP = 30.0
FIRST_SHARED = L - NSHARED


def make_weights(seed, layer_scalar="random", temper=False, embed_std=0.02):
    rng = np.random.default_rng(seed)

    def lin(o, i):  # 2-D, no "embed": N(0, 1/fan_in)
        return (rng.standard_normal((o, i), dtype=np.float32) / np.sqrt(i)).astype(np.float32)

    def norm(n):  # "norm" in name: 1 + N(0, 0.02)
        return (1.0 + 0.02 * rng.standard_normal(n)).astype(np.float32)

    def other(*s):  # embeddings, layer_scalar: N(0, 0.02)
        return (0.02 * rng.standard_normal(s)).astype(np.float32)

    w = {"embed": other(V, H) * np.float32(embed_std / 0.02), "embed_ple": other(V, L * P),
         "ple_proj": lin(L * P, H), "ple_norm": norm(P),
         "final_norm": norm(H), "layers": []}
    for i in range(L):
        hd = HD_F if i in FULL else HD_S
        mlp = INTER * (2 if i >= FIRST_SHARED else 1)
        lw = {"hd": hd, "q": lin(NH * hd, H), "k": lin(NKV * hd, H), "v": lin(NKV * hd, H), "o": lin(H, NH * hd),
              "q_norm": norm(hd), "k_norm": norm(hd), "gate": lin(mlp, H), "up": lin(mlp, H), "down": lin(H, mlp),
              "ple_gate": lin(P, H), "ple_proj": lin(H, P)}
        for n in ("in_norm", "post_attn_norm", "pre_ff_norm", "post_ff_norm", "post_ple_norm"):
            lw[n] = norm(H)
        s = other(1)
        lw["layer_scalar"] = s if layer_scalar == "random" else np.ones(1, np.float32)
        if temper:  # q.k of two unit-RMS vectors has std sqrt(hd); scale q_norm so scores have std ~1
            lw["q_norm"] = lw["q_norm"] / np.sqrt(hd)
        w["layers"].append(lw)
    return w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


def rope(x, pos, theta, frac):  # neox style on the first frac of dims; x [B,T,h,d]
    d = x.shape[-1]
    rd = int(d * frac)
    half = rd // 2
    inv = 1.0 / theta ** (np.arange(half, dtype=np.float32) * 2 / rd)
    ang = pos[:, None] * inv[None, :]  # [T, half]
    cos, sin = np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:rd]
    out = x.copy()
    out[..., :half] = x1 * cos - x2 * sin
    out[..., half:rd] = x2 * cos + x1 * sin
    return out


def quant(x, bits):  # symmetric, per token and per head (last axis = head_dim)
    if bits is None:
        return x
    qmax = 127.0 if bits == 8 else 7.0
    scale = np.abs(x).max(axis=-1, keepdims=True) / qmax
    scale = np.where(scale == 0, 1.0, scale)
    return (np.clip(np.round(x / scale), -qmax, qmax) * scale).astype(np.float32)


class Runner:
    def __init__(self, dtype="fp32", kv_bits=None, noise_seed=None):
        self.dtype, self.kv_bits = dtype, kv_bits
        self.noise = np.random.default_rng(noise_seed) if noise_seed is not None else None
        self.stats = {"score_std": [], "max_w": [], "entropy": [], "res_rms": []}

    def r(self, x):  # round an op's output to the model dtype
        if self.dtype == "fp16":
            y = x.astype(np.float16)
            if np.isinf(y).any():
                self.stats.setdefault("overflow", 0)
                self.stats["overflow"] += 1
            return y.astype(np.float32)
        return x.astype(np.float32)

    def mm(self, x, wt):  # fp32 accumulation, optional last-bit noise (other kernel's summation order), rounding
        y = x @ wt.T
        if self.noise is not None:
            y = y * (1.0 + 2.0 ** -11 * self.noise.standard_normal(y.shape).astype(np.float32))
        return self.r(y)

    def norm(self, x, w=None):
        y = x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS)
        return self.r(y * w if w is not None else y)

    def w(self, a):
        return self.r(a)

    def forward(self, w, tokens):
        pos = np.arange(T, dtype=np.float32)
        h = self.r(w["embed"][tokens] * self.r(np.float32(np.sqrt(H))))
        ple = self.r(w["embed_ple"][tokens] * np.float32(np.sqrt(P))).reshape(B, T, L, P)
        proj = self.r(self.mm(h, self.w(w["ple_proj"])) * np.float32(H ** -0.5)).reshape(B, T, L, P)
        pli = self.r((self.norm(proj, w["ple_norm"]) + ple) * np.float32(2 ** -0.5))
        cache = {}
        mask = np.triu(np.ones((T, T), bool), 1)
        for i, lw in enumerate(w["layers"]):
            hd, full = lw["hd"], i in FULL
            x = self.norm(h, lw["in_norm"])
            q = self.norm(self.mm(x, self.w(lw["q"])).reshape(B, T, NH, hd), lw["q_norm"])
            theta, frac = (1e6, 0.25) if full else (1e4, 1.0)
            q = self.r(rope(q, pos, theta, frac))
            if i < FIRST_SHARED:
                k = self.norm(self.mm(x, self.w(lw["k"])).reshape(B, T, NKV, hd), lw["k_norm"])
                k = self.r(rope(k, pos, theta, frac))
                v = self.norm(self.mm(x, self.w(lw["v"])).reshape(B, T, NKV, hd))
                cache[full] = (quant(k, self.kv_bits), quant(v, self.kv_bits))
            k, v = cache[full]
            s = np.einsum("bqhd,bkd->bhqk", q, k[:, :, 0, :]) * 1.0  # scaling = 1.0
            s = np.where(mask, -np.inf, s)
            m = s.max(-1, keepdims=True)
            e = np.exp(s - m)
            p = e / e.sum(-1, keepdims=True)
            valid = ~mask
            self.stats["score_std"].append(float(np.std(s[..., valid][..., 16:])))
            self.stats["max_w"].append(float(p.max(-1)[..., 16:].mean()))
            ent = -(p * np.log(np.where(p > 0, p, 1))).sum(-1)
            self.stats["entropy"].append(float(ent[..., 16:].mean() / np.log(np.arange(1, T + 1))[16:].mean()))
            o = self.r(np.einsum("bhqk,bkd->bqhd", p, v[:, :, 0, :])).reshape(B, T, NH * hd)
            a = self.norm(self.mm(o, self.w(lw["o"])), lw["post_attn_norm"])
            h = self.r(h + a)
            x = self.norm(h, lw["pre_ff_norm"])
            g = self.r(gelu_tanh(self.mm(x, self.w(lw["gate"]))) * self.mm(x, self.w(lw["up"])))
            mo = self.norm(self.mm(g, self.w(lw["down"])), lw["post_ff_norm"])
            h = self.r(h + mo)
            gt = self.r(gelu_tanh(self.mm(h, self.w(lw["ple_gate"]))) * pli[:, :, i, :])
            c = self.norm(self.mm(gt, self.w(lw["ple_proj"])), lw["post_ple_norm"])
            h = self.r(h + c)
            h = self.r(h * lw["layer_scalar"])
            self.stats["res_rms"].append(float(np.sqrt((h * h).mean())))
        hn = self.norm(h, w["final_norm"])
        logits = self.mm(hn, self.w(w["embed"]))
        return self.r(np.tanh(logits / SOFTCAP) * SOFTCAP)


def agree(a, b):
    return float((a.argmax(-1) == b.argmax(-1)).mean())


def relerr(a, b):
    return float(np.sqrt(((a - b) ** 2).mean() / (a * a).mean()))


def main():
    variants = [("randomized (ls~N(0,.02))", "random", False), ("ls=1", "one", False),
                ("ls~N(0,.02)+tempered q_norm", "random", True), ("ls=1 + tempered q_norm", "one", True),
                ("ls=1 + tempered + embed std 4/sqrt(H)", "one", True, 4 / np.sqrt(H))]
    seeds = [int(s) for s in sys.argv[1:]] or [0, 1]
    toks = np.random.default_rng(1234).integers(0, V, (B, T))
    print(f"H={H} heads={NH}/{NKV} hd={HD_S}/{HD_F} L={L} shared={NSHARED} INTER={INTER} P={P} V={V} B={B} T={T}")
    hdr = ("variant", "seed", "fp16vs32", "fp16vs16'", "int8", "int4", "int8@16", "scoreSD", "maxW", "Hnorm",
           "gap_med", "logitSD", "relerr16/8/4", "res_rms(L0,L14,L34)")
    print(" | ".join(hdr))
    for name, ls, temper, *es in variants:
        for seed in seeds:
            w = make_weights(seed, ls, temper, *es)
            ref = Runner("fp32")
            l32 = ref.forward(w, toks)
            l16 = Runner("fp16").forward(w, toks)
            l16b = Runner("fp16", noise_seed=7).forward(w, toks)
            l8 = Runner("fp32", kv_bits=8).forward(w, toks)
            l4 = Runner("fp32", kv_bits=4).forward(w, toks)
            l8h = Runner("fp16", kv_bits=8).forward(w, toks)
            srt = np.sort(l32, -1)
            gap = float(np.median(srt[..., -1] - srt[..., -2]))
            st = ref.stats
            rr = st["res_rms"]
            print(f"{name} | {seed} | {agree(l32, l16):.3f} | {agree(l16, l16b):.3f} | {agree(l32, l8):.3f} | "
                  f"{agree(l32, l4):.3f} | {agree(l16, l8h):.3f} | {np.mean(st['score_std']):.2f} | "
                  f"{np.mean(st['max_w']):.3f} | {np.mean(st['entropy']):.3f} | {gap:.4f} | {l32.std():.3f} | "
                  f"{relerr(l32, l16):.3f}/{relerr(l32, l8):.3f}/{relerr(l32, l4):.3f} | "
                  f"{rr[0]:.3g},{rr[14]:.3g},{rr[34]:.3g}", flush=True)
    print("columns: top-1 agreement over all B*T positions; fp16vs16' = fp16 vs fp16 with 1-ulp matmul noise "
          "(other kernel); int8/int4 = fp32 model with per-token-head KV quant vs fp32 unquantized; "
          "int8@16 = fp16 model int8 KV vs fp16 unquantized; scoreSD/maxW/Hnorm = mean over layers of attention score "
          "std, max softmax weight, entropy / log(#keys) (queries >= 16); gap_med = median top1-top2 logit gap; "
          "relerr = RMS(logit diff)/RMS(ref logits) vs fp32 for fp16, int8, int4; "
          "res_rms = residual RMS after layers 0, 14, 34.")


if __name__ == "__main__":
    main()
