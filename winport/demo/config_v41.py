"""The V4.1 demo variant's config: DeepSeek-V4.1's architecture at the V4 demo's toy width.

Every V4.1-only feature is present at small size, laid out like V4.1-Flash (compress_ratios
[0,0]+[2]x18+[1]x20+[0,0,0], kv sources [2,8,14,20], index sources [2,8,14,20,24,...], engram at
[1,14]) shrunk to six layers:

    layer  ratio  kv source  index source  other
    0      0      -          -             hash-routed MoE (tid2eid)
    1      2      yes        yes           owns the ratio-2 latents and index keys
    2      2      -          -             engram; reads layer 1's latents and top-k
    3      1      yes        yes           owns the ratio-1 latents and index keys
    4      1      -          yes           own top-k over layer 3's index keys
    5      0      -          -             sliding window only

SGLang 0.5.23 reads V4.1 configs through `DeepseekV41Config` (a DeepseekV3Config: it accepts
ratios 1 and 2, which its native V4 config rejects); `architectures` DeepseekV41ForCausalLM is
renamed to the V4 class there. The engram table size is the sum of the hash primes (one prime per
(n-gram size, head), drawn in ascending order above engram_vocab_size - 1), and
engram_compressed_vocab_size is the number of distinct normalized tokens of the demo tokenizer:
SGLang asserts both at start-up, tests/serve/test_v41_demo.py checks them here.

DSpark draft stages (SGLang 0.5.23 models/deepseek_v4_dspark.py), bundled in the checkpoint the way
SGLang expects a bundled draft (speculative/dspark_components/dspark_config.py
checkpoint_bundles_dspark_draft): `dspark_*` keys in config.json, `mtp.<stage>.*` tensors in the
weights. V4.1-Flash has 3 stages, block 5, target layers [37, 38, 39] of 40, Markov rank 256 at
hidden 5120 and a draft MoE of 128 experts top-3 (the model's: 384 top-6); the demo keeps 3 stages
and block 5, takes its last three layers [3, 4, 5] as targets, Markov rank 32 and a draft MoE of
4 experts top-1 (half the model's 8, and a top-k unlike the model's 2, so that SGLang's
per-stage expert override is exercised). The noise (mask) token is the pad token, which no text
produces. The confidence head (used by SGLang's non-static ragged verify modes) is included.
"""

from __future__ import annotations

from typing import Any

COMPRESS_RATIOS = [0, 2, 2, 1, 1, 0]
KV_SOURCE_LAYER_IDS = [1, 3]
INDEX_SOURCE_LAYER_IDS = [1, 3, 4]
ENGRAM_LAYER_IDS = [2]
# 2-, 3- and 4-grams, two heads: SGLang's CUDA hash kernel (kernels/ops/embeddings/engram_hash.py
# _launch_hash_kernel) asserts that n-gram size and head count are powers of two.
ENGRAM_MAX_NGRAM = 4
ENGRAM_HEADS = 2
ENGRAM_HEAD_DIM = 64  # two FP8 blocks of 32 (one E8M0 scale each)
ENGRAM_VOCAB = 509  # hash buckets per (n-gram size, head) start at the first prime >= this
# Distinct tokens of the demo tokenizer after SGLang's engram normalization (NFKC, accents,
# lowercase, whitespace); fixed by the tokenizer, which is deterministic.
ENGRAM_COMPRESSED_VOCAB = 937

DSPARK_STAGES = 3  # num_nextn_predict_layers
DSPARK_BLOCK = 5  # gamma: draft tokens per step (the verify window is gamma + 1)
DSPARK_TARGET_LAYER_IDS = [3, 4, 5]  # target layers whose hidden states feed the draft
DSPARK_MARKOV_RANK = 32
DSPARK_EXPERTS, DSPARK_EXPERTS_PER_TOK = 4, 1


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    d = 2
    while d * d <= n:
        if n % d == 0:
            return False
        d += 1
    return True


def engram_primes(n_layers: int = len(ENGRAM_LAYER_IDS), max_ngram: int = ENGRAM_MAX_NGRAM,
                  heads: int = ENGRAM_HEADS, vocab: int = ENGRAM_VOCAB) -> list[list[list[int]]]:
    """Bucket counts [layer][n-gram size - 2][head]: distinct primes, each the next one at or above
    `vocab` not used before (the layout V4.1's hash uses; table rows = their sum)."""
    used: set[int] = set()
    out = []
    for _ in range(n_layers):
        per_layer = []
        for _ in range(max_ngram - 1):
            row, p = [], vocab - 1
            for _ in range(heads):
                p += 1
                while not _is_prime(p) or p in used:
                    p += 1
                used.add(p)
                row.append(p)
            per_layer.append(row)
        out.append(per_layer)
    return out


def v41_config(base: dict[str, Any]) -> dict[str, Any]:
    """The V4.1 config dict, from the V4 demo config `base` (same widths, same tokenizer)."""
    cfg = dict(base)
    primes = engram_primes()
    cfg.update({
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "num_hidden_layers": len(COMPRESS_RATIOS),
        "compress_ratios": list(COMPRESS_RATIOS),
        "kv_source_layer_ids": list(KV_SOURCE_LAYER_IDS),
        "index_source_layer_ids": list(INDEX_SOURCE_LAYER_IDS),
        # V4.1's residual hand-off: each sublayer's mHC pre-mix comes from the previous one
        # (no separate LM-head mixer, so no hc_head_* tensors).
        "hc_pre_from_prev_sublayer": True,
        "q_head_norm": False,
        "candidate_source_layer_id": -1,
        "engram_layer_ids": list(ENGRAM_LAYER_IDS),
        "engram_num_embeddings": [sum(sum(r) for r in layer) for layer in primes],
        "engram_max_ngram_size": ENGRAM_MAX_NGRAM,
        "engram_vocab_size": ENGRAM_VOCAB,
        "engram_n_heads": ENGRAM_HEADS,
        "engram_head_dim": ENGRAM_HEAD_DIM,
        "engram_pad_token_id": base["pad_token_id"],
        "engram_compressed_vocab_size": ENGRAM_COMPRESSED_VOCAB,
        "vision_n_layers": 0,
        "num_nextn_predict_layers": DSPARK_STAGES,
        "dspark_block_size": DSPARK_BLOCK,
        "dspark_target_layer_ids": list(DSPARK_TARGET_LAYER_IDS),
        "dspark_markov_rank": DSPARK_MARKOV_RANK,
        "dspark_noise_token_id": base["pad_token_id"],
        "dspark_n_routed_experts": DSPARK_EXPERTS,
        "dspark_num_experts_per_tok": DSPARK_EXPERTS_PER_TOK,
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
    })
    return cfg
